"""Run minitensor's CUDA C++ kernels on the CPU: the tests' GPU where there is none.

``EmulatedModule(code)`` stands in for ``cupy.RawModule(code=code)``: it compiles the same
source with the host's C++ compiler against ``cuda_emulator.h`` (every CUDA thread a fiber,
``__syncthreads`` and the warp shuffles real barriers, threads that wait at different barriers
stopped as a deadlock, each block's shared
memory its own and NaN until written, a shuffle from a lane that has returned NaN too) and its
``get_function(name)`` returns a kernel called as CuPy's are, ``kernel(grid, block, args)``, on
NumPy arrays. So ``CudaKernels(numpy, load_module=EmulatedModule)`` runs the very kernels a GPU
runs, thread by thread, on any machine with g++ (C++20).

The emulated launch checks what a GPU cannot: the number of arguments, each pointer's dtype
against the kernel's parameter type, C-contiguity, and each scalar's exact type (a float64 where
the kernel takes a float would be read as garbage on a GPU); and, as a GPU does, the grid's and
the block's size. Its build checks each index into a fixed-size array, and, with
``CUDA_EMULATOR_SANITIZE=thread`` (``race_checked_env``), the order of every shared read and
write against the barriers: the data races of a block's threads. Under the race check, a
launch's blocks run at once (up to ``WAVE_THREADS`` threads), so a race between two blocks is
seen too: one block reading or writing what another writes in the same launch; and a warp
shuffle orders no memory, as on a GPU (``__syncwarp`` does). Otherwise blocks run one after
another.
"""

import ctypes
import functools
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import numpy

HEADER = pathlib.Path(__file__).with_name("cuda_emulator.h")
COMPILER = os.environ.get("CXX", "g++")

#: C parameter types of the kernels -> NumPy dtypes
_C_TYPES = {
    "float": numpy.float32,
    "double": numpy.float64,
    "int": numpy.int32,
    "long long": numpy.int64,
    "unsigned long long": numpy.uint64,
    "unsigned int": numpy.uint32,
    "unsigned short": numpy.uint16,
}
_CTYPES = {
    numpy.float32: ctypes.c_float,
    numpy.float64: ctypes.c_double,
    numpy.int32: ctypes.c_int32,
    numpy.int64: ctypes.c_int64,
    numpy.uint64: ctypes.c_uint64,
    numpy.uint32: ctypes.c_uint32,
    numpy.uint16: ctypes.c_uint16,
}
#: an index past the end of a fixed-size array (a shared tile, a row held in registers) stops the
#: process (SIGILL) instead of reading a neighbour's memory, as a GPU silently would
CHECKS = ("-fsanitize=bounds", "-fsanitize-undefined-trap-on-error")
#: ``CUDA_EMULATOR_SANITIZE=thread`` builds the kernels with ThreadSanitizer too
#: (tests/test_cuda_races.py): every read and write a CUDA thread makes is checked against the
#: barriers that order it with the other threads' (see ``race_checked_env``)
SANITIZE = os.environ.get("CUDA_EMULATOR_SANITIZE", "")
if SANITIZE not in ("", "thread"):
    raise ValueError(f"CUDA_EMULATOR_SANITIZE must be 'thread' or unset, got {SANITIZE!r}")
#: under the race check, the blocks of a launch run at once, up to this many threads in all (a
#: larger grid runs in waves of blocks, each wave after the last): ThreadSanitizer then sees the
#: accesses of two blocks of a wave to one word, unordered as a GPU leaves them
WAVE_THREADS = 1024
if SANITIZE:
    # -g: the report names the kernel's lines
    CHECKS += ("-fsanitize=thread", "-g", f"-DCUDA_EMULATOR_WAVE_THREADS={WAVE_THREADS}")
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


def available():
    """True where a C++ compiler is found (the emulator needs one)."""
    return shutil.which(COMPILER) is not None


def program(source, name, code):
    """The text of a Python program that runs ``code`` with ``np`` and ``kernel``, the kernel
    ``name`` of ``source`` emulated: for a test that runs a kernel in a process of its own (under
    the race check, or where the kernel stops the process)."""
    return (
        "import numpy as np\nfrom cuda_emulator import EmulatedModule\n"
        f"kernel = EmulatedModule({source!r}).get_function({name!r})\n{code}"
    )


def race_checked_env(env=None):
    """The environment of a Python process whose emulated kernels run under ThreadSanitizer, or
    None where the compiler has no ThreadSanitizer runtime.

    In this build a CUDA thread of the emulator is a ``std::thread`` (a fiber otherwise) and
    ``__syncthreads()`` a ``std::barrier``, so the sanitizer sees the very order the barriers
    promise: it reports two accesses to the same memory by two threads, at least one a write, that
    no barrier orders, whether or not the run's timing made them collide (a missing
    ``__syncthreads()`` between filling a shared tile and reading it, two threads writing one
    word). On a GPU that is ``compute-sanitizer --tool racecheck``'s job. A report stops the
    process with exit code 66. The runtime must be loaded before the interpreter starts
    (``LD_PRELOAD``), hence a process of its own."""
    found = subprocess.run([COMPILER, "-print-file-name=libtsan.so"], capture_output=True, text=True)
    runtime = found.stdout.strip()
    if found.returncode or not os.path.isabs(runtime) or not os.path.exists(runtime):
        return None
    env = dict(os.environ if env is None else env)
    env.update(
        CUDA_EMULATOR_SANITIZE="thread",
        LD_PRELOAD=runtime,
        TSAN_OPTIONS="halt_on_error=1 exitcode=66",
        OPENBLAS_NUM_THREADS="1",  # NumPy's own threads are not the kernels' business
    )
    return env


def _parameters(text):
    """'const float* x, long long n' -> [('float', True), ('long long', False)]"""
    params = []
    for part in text.split(","):
        part = " ".join(part.replace("*", " * ").replace("__restrict__", "").split())
        words = part.split(" ")[:-1]  # drop the parameter's name
        pointer = "*" in words
        ctype = " ".join(w for w in words if w not in ("const", "*"))
        if ctype not in _C_TYPES:
            raise TypeError(f"the emulator does not know the C type {ctype!r} (in {part!r})")
        params.append((ctype, pointer))
    return params


_SHARED = re.compile(r"^(\s*)__shared__\s+([^;]*?)\s*;", re.M)
_ARRAY = re.compile(r"(\w+)\s*((?:\[[^\]]*\])+)")


def _with_block_shared_memory(code):
    """Each ``__shared__ T a[N], b[M];`` (a line of its own) as ``auto& a =
    emulator::shared<T[N]>(__PRETTY_FUNCTION__, "a"); ...``: memory of the running block, NaN
    until written (see cuda_emulator.h)."""

    def rewrite(match):
        indent, text = match.groups()
        first = re.search(r"\w+\s*\[", text)
        if first is None or _ARRAY.sub("", text[first.start() :]).replace(",", "").strip():
            raise ValueError(f"the CUDA emulator takes shared arrays only, as `__shared__ T a[N], b[M];`: {text!r}")
        ctype = text[: first.start()].strip()
        declarations = [
            f'auto& {name} = emulator::shared<{ctype}{dims}>(__PRETTY_FUNCTION__, "{name}");'
            for name, dims in _ARRAY.findall(text[first.start() :])
        ]
        return indent + " ".join(declarations)

    return _SHARED.sub(rewrite, code)


def _expand_macros(code):
    """The source after the preprocessor: kernels that a macro defines, written out (and their
    ``__launch_bounds__``, a register budget for NVIDIA's compiler, dropped, as the header does)."""
    command = [COMPILER, "-E", "-P", "-D__launch_bounds__(...)=", "-x", "c++", "-"]
    done = subprocess.run(command, input=code, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the CUDA emulator could not preprocess the kernels:\n{done.stderr[-4000:]}")
    return done.stdout


@functools.cache  # one preprocessing and one library per source and process
def _build(code):
    """Compile ``code`` with a launcher per kernel into a shared library (cached by content, on
    disk across processes)."""
    kernels = {name: _parameters(params) for name, params in _KERNEL.findall(_expand_macros(code))}
    lines = [f'#include "{HEADER.name}"', _with_block_shared_memory(code)]
    for name, params in kernels.items():
        unpack = ", ".join(f"*reinterpret_cast<{c + '*' if p else c}*>(args[{i}])" for i, (c, p) in enumerate(params))
        lines.append(
            f'extern "C" void emulate_{name}(unsigned grid, unsigned block, void** args) {{\n'
            f"    emulator::launch(grid, block, [=] {{ {name}({unpack}); }});\n}}"
        )
    source = "\n".join(lines)
    # the flags in the key too: a build with the sanitizer is another library
    key = hashlib.sha256((source + HEADER.read_text() + repr(CHECKS)).encode()).hexdigest()[:16]
    folder = pathlib.Path(tempfile.gettempdir()) / "minitensor-cuda-emulator"
    folder.mkdir(exist_ok=True)
    library = folder / f"{key}.so"
    if not library.exists():
        cpp = folder / f"{key}.{os.getpid()}.cpp"
        cpp.write_text(source)
        partial = folder / f"{key}.{os.getpid()}.so"
        done = subprocess.run(
            [
                COMPILER,
                "-std=c++20",
                "-O1",
                "-shared",
                "-fPIC",
                "-pthread",
                *CHECKS,
                f"-I{HEADER.parent}",
                "-o",
                partial,
                cpp,
            ],
            capture_output=True,
            text=True,
        )
        cpp.unlink()
        if done.returncode:
            raise RuntimeError(f"the CUDA emulator could not compile the kernels:\n{done.stderr[-4000:]}")
        os.replace(partial, library)  # whole or not at all, also with other processes compiling
    return kernels, ctypes.CDLL(str(library))


def _dims(d):
    return (d,) if isinstance(d, int) else tuple(d)


class EmulatedKernel:
    #: the most threads (grid times block) of any launch in this process: the race check's cases
    #: keep it within ``WAVE_THREADS``, so that all the blocks of each launch run at once
    most_threads = 0

    def __init__(self, name, params, function):
        self.name, self.params, self.function = name, params, function
        function.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        function.restype = None

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        grid, block = _dims(grid), _dims(block)
        if any(d != 1 for d in grid[1:] + block[1:]):
            raise ValueError(f"{self.name}: the emulator launches 1-D grids and blocks, got {grid}, {block}")
        if grid[0] < 1 or not 1 <= block[0] <= 1024:  # CUDA refuses it: "invalid configuration argument"
            raise ValueError(f"{self.name}: a launch needs 1 or more blocks of 1 to 1,024 threads, got {grid}, {block}")
        if len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
        values = []
        for i, ((ctype, pointer), arg) in enumerate(zip(self.params, args)):
            dtype = numpy.dtype(_C_TYPES[ctype])
            if pointer:
                if not isinstance(arg, numpy.ndarray) or arg.dtype != dtype or not arg.flags.c_contiguous:
                    raise TypeError(
                        f"{self.name}: argument {i} must be a C-contiguous {dtype} array ({ctype}*), got "
                        f"{type(arg).__name__} {getattr(arg, 'dtype', '')}"
                        + ("" if not isinstance(arg, numpy.ndarray) or arg.flags.c_contiguous else " (not contiguous)")
                    )
                values.append(ctypes.c_void_p(arg.ctypes.data))
            else:
                if not isinstance(arg, numpy.generic) or arg.dtype != dtype:
                    raise TypeError(f"{self.name}: argument {i} must be a numpy.{dtype} ({ctype}), got {arg!r}")
                values.append(_CTYPES[dtype.type](arg.item()))
        argv = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        EmulatedKernel.most_threads = max(EmulatedKernel.most_threads, grid[0] * block[0])
        self.function(grid[0], block[0], argv)


class EmulatedModule:
    """``cupy.RawModule(code=...)`` on the CPU: see the module docstring."""

    def __init__(self, code, options=()):
        self.kernels, self.library = _build(code)

    def get_function(self, name):
        if name not in self.kernels:
            raise AttributeError(f"no kernel {name!r} in the module (it has {sorted(self.kernels)})")
        return EmulatedKernel(name, self.kernels[name], getattr(self.library, f"emulate_{name}"))


class RecordingModule:
    """Stands in for ``cupy.RawModule`` where a test needs the launches, not their results: every
    ``kernel(grid, block, args)`` is appended to ``RecordingModule.launches`` (the tests'
    ``recorded`` fixture empties it first)."""

    launches = []

    def __init__(self, code):
        assert "__global__" in code

    def get_function(self, name):
        return lambda grid, block, args: RecordingModule.launches.append((name, grid, block, args))
