"""NVRTC, NVIDIA's runtime CUDA compiler, called through ctypes: what ``cupy.RawModule`` compiles
the GPU's kernels with, here without CuPy and without a GPU (compiling needs neither).

``tests/test_cuda_kernels.py`` compiles every source the launcher hands to CuPy with it. The
tests' emulator compiles those texts with g++, which takes host code NVRTC refuses (a standard
header, a name only the emulator defines), and nvcc finds the host's headers too; NVRTC has
none, so only NVRTC itself says whether a GPU run will compile them. The library comes from
NVIDIA's wheel (``pip install nvidia-cuda-nvrtc``, which ``.ci/run`` installs; CuPy's ``[ctk]``
extra installs it too) or from a CUDA toolkit on the library path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import re
from pathlib import Path

#: what ``cupy.RawModule`` adds to a module's own options before NVRTC sees them (CuPy 14:
#: ``cupy/cuda/compiler.py``, ``_compile_with_cache_cuda`` and ``_compile_using_nvrtc``), beside
#: the GPU's ``-arch``
CUPY_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")


def library_path() -> str | None:
    """The newest libnvrtc of NVIDIA's wheels (``nvidia/cu13/lib``, ``nvidia/cuda_nvrtc/lib``), else
    the one the loader finds, else None."""
    spec = importlib.util.find_spec("nvidia")
    found = []
    for root in (spec.submodule_search_locations or []) if spec else []:
        found += [p for p in Path(root).glob("*/lib/libnvrtc.so.*") if re.fullmatch(r"libnvrtc\.so\.\d+", p.name)]
    if found:
        return str(max(found, key=lambda p: int(p.name.rsplit(".", 1)[1])))
    return ctypes.util.find_library("nvrtc")


class Nvrtc:
    """One loaded libnvrtc: ``compile(code, options) -> (PTX or cubin bytes, log)``."""

    def __init__(self, path: str):
        # libnvrtc opens its builtins library (``libnvrtc-builtins.so.13.0``) by name when it first
        # compiles; some of NVIDIA's wheels (13.0) set no RUNPATH, so the loader finds it beside
        # libnvrtc only if it is already loaded or the folder is on LD_LIBRARY_PATH. Loading it
        # first, from beside the library, makes the wheel work as installed.
        for builtins in sorted(Path(path).parent.glob("libnvrtc-builtins.so.*")):
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(path)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def _check(self, result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call}: {self.lib.nvrtcGetErrorString(result).decode()}")

    def _read(self, program: ctypes.c_void_p, what: str) -> bytes:
        size = ctypes.c_size_t()
        self._check(getattr(self.lib, f"nvrtcGet{what}Size")(program, ctypes.byref(size)), f"nvrtcGet{what}Size")
        buffer = ctypes.create_string_buffer(size.value)
        self._check(getattr(self.lib, f"nvrtcGet{what}")(program, buffer), f"nvrtcGet{what}")
        return buffer.raw

    def compile(self, code: str, options: tuple[str, ...]) -> tuple[bytes | None, str]:
        """Compile ``code`` (one text, as CuPy hands it over) with ``options``: PTX for
        ``-arch=compute_XX``, a cubin for ``-arch=sm_XX``, and NVRTC's log; (None, log) if it
        refuses the code."""
        program = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(program), code.encode(), b"kern.cu", 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            encoded = (ctypes.c_char_p * len(options))(*(option.encode() for option in options))
            result = self.lib.nvrtcCompileProgram(program, len(options), encoded)
            log = self._read(program, "ProgramLog").rstrip(b"\0").decode(errors="replace")
            if result != 0:
                return None, log
            arch = next(option for option in options if option.startswith("-arch="))
            return self._read(program, "CUBIN" if "=sm_" in arch else "PTX"), log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(program))


def entries(compiled: bytes) -> set[str]:
    """The names a kernel may be looked up by in PTX or a cubin: PTX declares each kernel as
    ``.entry name(``; a cubin (an ELF file) holds its symbols' names between NUL bytes in its
    string table (every name there, so a superset of the kernels)."""
    if compiled[:4] == b"\x7fELF":
        return {name.decode() for name in re.findall(rb"(?<=\0)([A-Za-z_]\w*)(?=\0)", compiled)}
    return {name.decode() for name in re.findall(rb"\.entry\s+(\w+)\s*\(", compiled)}
