"""The GPU backend: CuPy arrays, CUDA C++ kernels compiled by CuPy (``kernels/cuda``).

CuPy copies NumPy's API, so every op runs unchanged with ``xp = cupy``; this class holds
only what the two libraries spell differently (see ``base.py``). It is built the first time
someone asks for ``"cuda"`` (``get_backend("cuda")``), never at ``import minitensor``: CuPy
takes about a second to import and most users train on the CPU.

Is there a GPU? ``import cupy`` succeeds on a machine with no driver or no device; only the
first allocation fails (``CUDARuntimeError``). So ``cuda_unavailable_reason`` asks
``cupy.is_available()`` up front and, when it says no, asks the runtime why, so the one
error a user sees says what is missing: CuPy itself, the NVIDIA driver, or a device.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy

from ..dtypes import is_bfloat16
from ..errors import DeviceError
from ..kernels.cuda import CudaKernels
from . import cublas_gemm
from .base import Backend
from .cuda_graph import Capture

if TYPE_CHECKING:
    from ..tensor import Array, DType, Shape

# CuPy is optional and need not be installed where mypy runs: its module is passed around as
# ``cupy: Any`` (and [tool.mypy] ignore_missing_imports covers the lazy ``import cupy``).

#: what to install; the CUDA major version of the wheel must match the driver's
INSTALL_HINT = (
    "pip install 'minitensor[gpu]' (CuPy for CUDA 12, cupy-cuda12x) or 'minitensor[gpu-cuda13]' for a CUDA 13 "
    "driver (cupy-cuda13x); nvidia-smi shows the driver's CUDA version, docs/gpu.md says more"
)


def cuda_unavailable_reason(cupy: Any = None) -> str | None:
    """None if CuPy can use a GPU here, else a sentence that says what is missing."""
    if cupy is None:
        try:
            # lazy: CuPy is optional (the gpu extra); no-redef: the module takes the parameter's place
            import cupy  # type: ignore[no-redef]
        except ModuleNotFoundError as e:
            if e.name not in (None, "cupy"):  # CuPy is there, one of its own imports is not
                return f"CuPy is installed but cannot be imported ({e}); reinstall it: {INSTALL_HINT}"
            return f"CuPy is not installed ({e}); {INSTALL_HINT}"
        except Exception as e:  # e.g. a CuPy built for another NumPy: say which, not a traceback
            return (
                f"CuPy is installed but cannot be imported with NumPy {numpy.__version__} ({type(e).__name__}: "
                f"{e}); install a CuPy release that supports it: {INSTALL_HINT}"
            )
    try:
        if cupy.is_available():
            return None
    except Exception as e:  # a broken CUDA installation: report it rather than crash
        return f"CuPy cannot use CUDA here: {type(e).__name__}: {e}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver, driver too old, no device...
        text = f"{type(e).__name__}: {e}"
        if "NoDevice" in text:
            return f"CuPy is installed but the machine has no CUDA GPU ({text})"
        if "Driver" in text or "libcuda" in text:
            return (
                f"CuPy is installed but the NVIDIA driver is missing or too old for this CuPy build ({text}); "
                "install the driver, or the CuPy wheel that matches its CUDA version (cupy-cuda12x, cupy-cuda13x)"
            )
        return f"CuPy is installed but cannot reach a GPU ({text})"
    if count == 0:
        return "CuPy is installed but the machine has no CUDA GPU (0 devices)"
    return "CuPy is installed and sees a GPU, but cupy.is_available() says it cannot use it"


def cuda_summary(cupy: Any) -> str:
    """One line on the GPU stack: CuPy's version, the CUDA runtime and driver, device 0."""
    runtime = cupy.cuda.runtime

    def version(v: int) -> str:  # 13000 -> "13.0"
        return f"{v // 1000}.{v % 1000 // 10}"

    props = runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return (
        f"CuPy {cupy.__version__}, CUDA runtime {version(runtime.runtimeGetVersion())}, "
        f"driver {version(runtime.driverGetVersion())}, {name} (compute capability {props['major']}.{props['minor']})"
    )


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser of x + the golden-ratio increment, on Python integers kept to 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _drawn(dtype: DType) -> Any:
    """The dtype a generator draws for ``dtype``: cuRAND's float32 or float64 (float16 is drawn in
    float32, then converted)."""
    return dtype if numpy.dtype(dtype) in (numpy.float32, numpy.float64) else numpy.float32


class CupyBackend(Backend):
    device = "cuda"

    def __init__(self, cupy: Any = None) -> None:
        if cupy is None:
            # lazy: CuPy is optional (the gpu extra); no-redef: the module takes the parameter's place
            import cupy  # type: ignore[no-redef]
        self.xp = cupy
        self._kernels: CudaKernels | None = None
        self.seed(int.from_bytes(os.urandom(8), "little"))

    def check_it_runs(self) -> None:
        """Run one tiny CuPy kernel (CuPy compiles it with NVRTC for this GPU) and load the CUDA
        libraries minitensor calls through CuPy (cuBLAS for the matrix products, cuRAND for the
        random draws), or raise a ``DeviceError`` that says what failed and what to install: a
        CuPy without its CUDA libraries (``cupy-cuda13x`` without ``[ctk]`` on a machine with no
        CUDA toolkit), or built for another CUDA major, fails here rather than inside a user's op
        (CuPy loads each library at its first use: the first ``@`` would raise an ImportError)."""
        what = "run a kernel on it"
        try:
            (self.xp.arange(4) * 2).sum()
            for library in ("cuBLAS", "cuRAND"):
                what = f"load {library}"
                getattr(self.xp.cuda, library.lower())
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            raise DeviceError(
                f"device 'cuda' is not available: CuPy sees a GPU but cannot {what} "
                f"({type(e).__name__}: {first}); {INSTALL_HINT}"
            ) from e

        # -- data in and out ------------------------------------------------------------

    def array(self, data: Any, dtype: DType = None) -> Array:
        return self.xp.array(data, dtype=dtype)  # host data -> device: one explicit copy

    def to_numpy(self, array: Array) -> numpy.ndarray:
        return self.xp.asnumpy(array)  # always a new host array

    def is_array(self, obj: object) -> bool:
        return isinstance(obj, self.xp.ndarray)

    # -- random numbers, drawn on the GPU (dropout masks never cross the bus) --------------
    # A cuRAND generator's state cannot be read back, yet a checkpoint must restore it (an
    # exact ``--resume``). So the state is two integers on the host: the seed and the number
    # of draws so far; draw n uses a fresh Philox generator seeded from (seed, n). Philox is
    # counter-based, so seeding it is cheap. Dropout, the one draw of every step, needs no
    # generator at all: its kernel hashes (seed, element index), and its seed is made here
    # on the host (draw_seed), so a step neither builds a generator nor reads the device.
    def seed(self, seed: int) -> None:
        self._seed, self._draws = int(seed), 0

    def get_rng_state(self) -> dict[str, int]:
        return {"seed": self._seed, "draws": self._draws}

    def set_rng_state(self, state: dict[str, int]) -> None:
        self._seed, self._draws = int(state["seed"]), int(state["draws"])

    def draw_seed(self) -> int:
        """A seed in [0, 2^62) for a counter-based kernel (dropout): draw n of (seed, n), on the host.

        Two rounds of SplitMix64 (Steele et al. 2014), the hash the dropout kernel itself uses:
        splitmix(splitmix(seed) xor n). Each round is a bijection of 64-bit integers, so the draws
        of one seed differ before the last two bits are dropped. A few Python integer operations,
        where a NumPy SeedSequence per draw cost far more: this runs at every dropout of every step."""
        if self._capture is not None:  # inside a CUDA graph: a seed on the device, drawn at each replay
            return self._capture.draw_seed()
        self._draws += 1
        return _splitmix64(self.seed_key() ^ self._draws) >> 2

    def seed_key(self) -> int:
        """splitmix64(seed): draw n is splitmix64(key ^ n) >> 2 (on the device: ``draw_seeds``)."""
        return _splitmix64(self._seed & _MASK64)

    def skip_draws(self, count: int) -> int:
        """Count ``count`` draws as made (a replayed graph made them on the device); returns the
        number of the first."""
        self._draws += count
        return self._draws - count + 1

    def _generator(self) -> Any:  # a cupy.random.RandomState
        if self._capture is not None:
            raise DeviceError(
                "cuda graph: a random draw other than dropout's (cuRAND: randn, rand, an initialisation) cannot be "
                "captured, its seed would be replayed; make it before the capture or outside the graph"
            )
        return self.xp.random.RandomState(self.draw_seed(), method=self.xp.cuda.curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)

    # -- CUDA graphs (cuda_graph.py) ------------------------------------------------------------
    def begin_capture(self) -> Capture:
        """Start capturing a CUDA graph of what this thread launches next (``mt.cuda.graph``)."""
        if self._capture is not None:
            raise DeviceError("cuda graph: a capture is already under way; end it before starting another")
        capture = Capture(self)
        capture.begin()
        self._capture = capture
        return capture

    @property
    def capturing(self) -> bool:
        return self._capture is not None

    def keep_for_replay(self, array: Any) -> None:
        if self._capture is not None:
            self._capture.kept.append(array)

    def end_capture(self, failed: bool = False) -> Capture:
        """End the capture begun by ``begin_capture`` (``failed``: after an error, keeping no graph)."""
        capture, self._capture = self._capture, None
        if capture is None:
            raise DeviceError("cuda graph: no capture is under way")
        capture.abort() if failed else capture.end()
        return capture

    def normal(self, shape: Shape, dtype: DType) -> Array:
        return self._generator().standard_normal(shape, dtype=_drawn(dtype)).astype(dtype, copy=False)

    def random(self, shape: Shape, dtype: DType) -> Array:
        return self._generator().random_sample(shape, dtype=_drawn(dtype)).astype(dtype, copy=False)

    def integers(self, low: int, high: int, shape: Shape) -> Array:
        return self._generator().randint(low, high, shape, dtype="int64")

    # -- what CuPy spells differently -------------------------------------------------------
    def index_add(self, target: Array, index: Any, values: Array) -> None:
        # cupy.add.at is an atomic scatter-add: repeated indices accumulate
        self.xp.add.at(target, index, values)

    # -- TF32 and bfloat16 tensor cores for float32 products (core/precision.py) ------------------
    # CuPy takes two routes to cuBLAS, and each must be told. Its 2-D products pass a compute
    # type, CuPy's per-dtype setting (read once from the CUPY_TF32 environment variable, or set
    # through the setter its own tests use). Its batched products (attention's scores and
    # P V) pass the legacy type CUDA_R_32F instead, which follows the math mode of CuPy's cuBLAS
    # handle. Neither route has a bfloat16 mode for float32 data, so at "medium" minitensor's
    # products (every one goes through ``matmul`` below) call cuBLAS themselves (cublas_gemm.py);
    # CuPy's setting still serves any product of CuPy's own.
    COMPUTE_TYPES = {"highest": "COMPUTE_TYPE_DEFAULT", "high": "COMPUTE_TYPE_TF32", "medium": "COMPUTE_TYPE_TF32"}
    #: cublasMath_t (cublas_api.h): CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH (CuPy names only the first)
    MATH_MODES = {"highest": 0, "high": 3, "medium": 3}

    def set_float32_matmul_precision(self, precision: str) -> None:
        self._precision = precision  # a capture's products ask cuBLAS for it themselves (matmul)
        self._bfloat16 = False  # until "medium" is set, below, where the GPU has them
        # CuPy itself falls back to float32, with a warning, on a GPU older than compute
        # capability 8.0. A CuPy without these settings keeps float32, and says so.
        linalg: Any = getattr(getattr(self.xp, "_core", None), "_routines_linalg", None)
        if linalg is None:
            try:
                linalg = importlib.import_module(f"{self.xp.__name__}._core._routines_linalg")
            except (ImportError, AttributeError, TypeError):
                linalg = None
        compute_type = getattr(linalg, self.COMPUTE_TYPES[precision], None)
        try:
            cublas, handle = self.xp.cuda.cublas, self.xp.cuda.get_cublas_handle()
        except AttributeError:
            cublas = handle = None
        if linalg is None or compute_type is None or not hasattr(linalg, "set_compute_type") or cublas is None:
            if precision == "highest":  # what such a CuPy does anyway
                return
            warnings.warn(
                f"set_float32_matmul_precision({precision!r}): this CuPy ({getattr(self.xp, '__version__', '?')}) "
                "has no cuBLAS compute-type setting that minitensor knows; float32 products stay in float32",
                stacklevel=3,
            )
            return
        linalg.set_compute_type(numpy.float32, compute_type)
        cublas.setMathMode(handle, self.MATH_MODES[precision])  # this thread's handle on the current GPU
        # bfloat16 tensor cores from compute capability 8.0 (Ampere) on; before, cuBLAS would
        # compute in float32 anyway, and CuPy has already warned that TF32 is not there either
        self._bfloat16 = precision == "medium" and self._bfloat16_cores()

    _bfloat16 = False  # float32 products on bfloat16 tensor cores ("medium")
    _precision = "highest"  # the float32 matmul precision set last
    _capture: Capture | None = None  # the CUDA graph being captured (cuda_graph.py)

    def _properties(self) -> dict[str, Any]:
        runtime = self.xp.cuda.runtime
        return runtime.getDeviceProperties(runtime.getDevice())  # type: ignore[no-any-return]

    def _compute_capability(self) -> int:
        properties = self._properties()
        return 10 * int(properties["major"]) + int(properties["minor"])

    def memory_size(self) -> int | None:
        return int(self._properties()["totalGlobalMem"])  # the current GPU's

    def matmul(self, a: Array, b: Array, bfloat16_cores: bool = False) -> Array:
        if is_bfloat16(a.dtype) or is_bfloat16(b.dtype):  # as float32, rounded (Backend)
            return self.bfloat16_matmul(a, b)
        fast = (self._bfloat16 or bfloat16_cores) and a.dtype == numpy.float32 and b.dtype == numpy.float32
        if self._capture is not None:  # CuPy refuses to call cuBLAS inside a capture: call it directly
            precision = "medium" if fast else self._precision
            return cublas_gemm.captured_matmul(self.xp, self._capture.cublas(), a, b, precision)
        if fast:
            return cublas_gemm.bf16_matmul(self.xp, a, b)
        return a @ b

    def rounded_matmul(self, a: Array, b: Array) -> Array:
        # exact on bfloat16 tensor cores (Backend.rounded_matmul): taken whatever the precision
        return self.matmul(a, b, bfloat16_cores=self._bfloat16_cores())

    def _bfloat16_cores(self) -> bool:
        """Whether this GPU has bfloat16 tensor cores: compute capability 8.0 (Ampere) or later."""
        if self._has_bfloat16_cores is None:
            self._has_bfloat16_cores = self._compute_capability() >= 80
        return self._has_bfloat16_cores

    _has_bfloat16_cores: bool | None = None

    def direct_cublas(self) -> Any:
        """libcublas through ctypes (``cublas_gemm.DirectCublas``), for the products of a capture."""
        return cublas_gemm.DirectCublas(self.xp)

    #: the CPU's fused kernels (kernels/fused.py) that the GPU has too, by the ops' names for them
    FUSED = {
        "dropout_forward": "dropout",  # the same mask as the CPU's for the same seed
        "dropout_backward": "dropout",
        "relu_forward": "relu_forward",
        "relu_backward": "relu_backward",
        "layer_norm_forward": "layer_norm_forward",
        "layer_norm_backward": "layer_norm_backward",
        "adam_update": "adam_update",
        # multi-tensor kernels (multi_tensor.cu), which the CPU has not: one launch for every
        # parameter (Adam, AdamW) or gradient (clip_grad_norm_, grad_norm) of one dtype
        "adam_update_multi": "adam_update_multi",
        "l2_norm_multi": "l2_norm_multi",
        "scale_multi": "scale_multi",
    }

    def fused(self, name: str, dtype: DType) -> Callable[..., Any] | None:
        # each replaces several CuPy operators (a launch each) by one kernel of kernels/cuda
        if name.endswith("_multi") and self._capture is not None:
            return None  # their tables of addresses are uploads, which a capture cannot make
        if name in self.FUSED and numpy.dtype(dtype) in (numpy.float32, numpy.float64):
            return getattr(self.kernels, self.FUSED[name])
        return None

    @property
    def bfloat16_kernels(self) -> CudaKernels:
        return self.kernels  # elementwise.cu's bfloat16_narrow, bfloat16_widen and bfloat16_round

    @property
    def attention_kernels(self) -> CudaKernels:
        """The streamed-attention kernels that ``flash_attention`` runs here (``attention.cu``)."""
        return self.kernels

    @property
    def kernels(self) -> CudaKernels:
        if self._kernels is None:
            # CUDA C++ compiled by CuPy on first use, launched on CuPy's current stream
            self._kernels = CudaKernels(self.xp)
        return self._kernels
