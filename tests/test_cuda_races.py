"""The GPU kernels free of data races (a block's threads, a launch's blocks, a warp's lanes), checked
on the CPU.

A block of CUDA threads shares its tiles of shared memory and orders its reads and writes of
them with ``__syncthreads()``. One barrier missing lets a fast thread overwrite a tile that a
slow one is still reading: the result is wrong sometimes, on some GPUs, and a test of the values
catches it only when the timing happens to collide. Built for this check, the tests' CUDA
emulator runs every CUDA thread as a ``std::thread`` (a fiber otherwise) and ``__syncthreads()``
as a ``std::barrier``, so GCC's
ThreadSanitizer sees exactly the order the barriers give: built with it
(``cuda_emulator.race_checked_env``), the emulator reports every pair of accesses to one word,
one of them a write, that no barrier orders, whether or not this run's timing made them collide.
On a GPU, ``compute-sanitizer --tool racecheck`` does this job for shared memory.

The blocks of a grid share no barrier at all: a GPU runs them in any order, or together, so one
block must never read or write what another writes in the same launch (the kernels give each
output to one block, and add blocks' partial sums up in a later launch). Built for the check, the
emulator runs all the blocks of a launch at once, and the sanitizer reports such a pair of accesses
too, where the emulator's usual order (block 0, then 1, ...) gives the values a careless kernel
expects. Within a warp, a shuffle passes values between lanes and orders no memory (``__syncwarp``
does), so the check reports lanes that pass a value through shared memory with only a shuffle
between the write and the read, although the emulator's shuffles wait at barriers.

Here each kernel source runs cases of ``test_cuda_kernels.py`` and ``test_multi_tensor.py``
(their values checked as there) in a process whose emulator is built with ThreadSanitizer; a
report stops that process and fails the test with the report. Kernels written here without one of
their barriers, passing a value from block to block, or ordering lanes with a shuffle, show that
the check fails where it should.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import cuda_emulator
import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
ENV = cuda_emulator.race_checked_env() if cuda_emulator.available() else None

# As for the emulator itself: without ThreadSanitizer this fails under CI=true (.ci/run installs
# g++, which brings it) and skips elsewhere.
if ENV is None and os.environ.get("CI") != "true":
    pytest.skip(
        f"the race check needs a C++ compiler with ThreadSanitizer ({cuda_emulator.COMPILER})", allow_module_level=True
    )


def race_checked(code, timeout=600):
    """Run ``code`` in a Python process whose emulated kernels are race-checked; the tests'
    folder is on its path."""
    assert ENV is not None, "no ThreadSanitizer runtime for the C++ compiler (g++ brings libtsan)"
    program = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n{code}"
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", program], env=ENV, cwd=TESTS, capture_output=True, text=True, timeout=timeout
        )
        # The sanitizer's runtime failing to map its own memory ("ThreadSanitizer failed to
        # allocate ... (errno: 12)", seen twice in about 150 runs) says nothing about the
        # kernels: that run, and only that, goes again.
        if "ThreadSanitizer failed to allocate" not in done.stderr:
            break
    return done


def report(done):
    """The sanitizer's report (or the error), for a failing assertion."""
    return f"exit code {done.returncode}\n{done.stderr[-6000:]}"


def assert_reported(done, name):
    """The sanitizer found a data race in the kernel ``name`` and stopped the process."""
    assert done.returncode == 66, report(done)
    assert "ThreadSanitizer: data race" in done.stderr and name in done.stderr


# -- the check fails where it should ---------------------------------------------------------------
SHIFT = """
extern "C" __global__ void shift_through_shared(float* out, int rounds) {
    __shared__ float tile[64];
    float sum = 0.0f;
    for (int t = 0; t < rounds; ++t) {
        BEFORE_WRITE
        tile[threadIdx.x] = float(100 * t + threadIdx.x);  // each thread fills its own slot
        BEFORE_READ
        sum += tile[(threadIdx.x + 1) % blockDim.x];  // and reads its neighbour's
    }
    out[threadIdx.x] = sum;
}
"""


@pytest.mark.parametrize(
    "missing",
    [
        None,
        "BEFORE_READ",  # a neighbour's slot read before it is written
        "BEFORE_WRITE",  # the next round's write before the neighbour has read this round's
    ],
)
def test_a_missing_barrier_is_reported(missing):
    """A tile filled, then read across threads, twice: with both barriers the sums are right and
    nothing is reported; without either one, the sanitizer names the kernel and the run fails
    (exit code 66), although 64 threads on two cores may well have read the right values."""
    source = SHIFT
    for barrier in ("BEFORE_WRITE", "BEFORE_READ"):
        source = source.replace(barrier, "" if barrier == missing else "__syncthreads();")
    threads, rounds = 64, 2
    done = race_checked(
        cuda_emulator.program(
            source,
            "shift_through_shared",
            f"out = np.zeros({threads}, np.float32)\n"
            f"kernel((1,), ({threads},), (out, np.int32({rounds})))\n"
            "print(out.tolist())\n",
        )
    )
    if missing is None:
        assert done.returncode == 0, report(done)
        neighbour = (np.arange(threads) + 1) % threads
        assert ast.literal_eval(done.stdout) == sum(100 * t + neighbour for t in range(rounds)).tolist()
    else:
        assert_reported(done, "shift_through_shared")


CARRY = """
extern "C" __global__ void running_sum(const float* x, float* out, int n) {
    // block b adds its element to block b - 1's sum: right only if block b - 1 has finished
    if (threadIdx.x == 0 && blockIdx.x < n) out[blockIdx.x] = x[blockIdx.x] + (blockIdx.x ? out[blockIdx.x - 1] : 0.0f);
}
"""


def test_a_value_passed_between_blocks_is_reported():
    """A running sum that hands each block's total to the next block through global memory: the
    emulator's usual order of blocks (0, 1, 2, ...) gives the right sums, as a GPU might on one
    run and not the next. Race-checked, the blocks run at once and the sanitizer reports block
    b's read of what block b - 1 writes (exit code 66)."""
    n = 8
    program = cuda_emulator.program(
        CARRY,
        "running_sum",
        f"x, out = np.arange(1, {n + 1}, dtype=np.float32), np.zeros({n}, np.float32)\n"
        f"kernel(({n},), (32,), (x, out, np.int32({n})))\n",
    )
    usual = {}
    exec(program, usual)  # in this process: the emulator's usual build, blocks in order
    assert usual["out"].tolist() == np.cumsum(np.arange(1, n + 1)).tolist()  # "right"
    assert_reported(race_checked(program), "running_sum")


BROADCAST = """
extern "C" __global__ void broadcast_through_shared(float* out) {
    __shared__ float value[1];
    if (threadIdx.x == 0) value[0] = 42.0f;
    ORDER
    out[threadIdx.x] = value[0];
}
"""


@pytest.mark.parametrize("order", ["__syncwarp();", "__shfl_sync(0xffffffffu, 0, 0);"])
def test_a_shuffle_does_not_order_memory(order):
    """Lane 0 writes a shared word that the warp's lanes then read. ``__syncwarp()`` between the
    write and the reads orders them; a shuffle moves a value between lanes and orders no memory
    (CUDA C++ Programming Guide, "Synchronization Functions"), so with only a shuffle there the
    sanitizer reports the race, although every lane read 42 in the emulator, whose shuffles wait
    at barriers."""
    source = BROADCAST.replace("ORDER", order)
    done = race_checked(
        cuda_emulator.program(
            source,
            "broadcast_through_shared",
            "out = np.zeros(32, np.float32)\nkernel((1,), (32,), (out,))\nprint(out.tolist())\n",
        )
    )
    if order == "__syncwarp();":
        assert done.returncode == 0, report(done)
        assert ast.literal_eval(done.stdout) == [42.0] * 32
    else:
        assert_reported(done, "broadcast_through_shared")


# -- every kernel source, race-checked ---------------------------------------------------------------
def attention_cases():
    """attention.cu's forward, dQ and dK/dV kernels: one and several walkers a row, two and four
    threads a row, grouped heads, lengths, causal, a learned windowed bias and its gradient, dropout."""
    from test_cuda_kernels import STREAMED_CASES, check_attention, emulated, relative_table

    B, H, G, Q, K, d, causal, lens = STREAMED_CASES[1]  # grouped heads, lengths, K > Q
    check_attention(emulated(), B, H, G, Q, K, d, np.float32, causal, lens)
    check_attention(emulated(attention_splits=2), 1, 2, 2, 70, 70, 8, np.float64, True, None)  # two query tiles
    check_attention(emulated(attention_splits=4), 1, 2, 1, 20, 19, 128, np.float32, True, None)  # 16 threads a row
    bias = relative_table(np.random.default_rng(7), 2, 40, 45, np.float64, 9, 3, 0)
    check_attention(emulated(attention_splits=2), 2, 2, 2, 40, 45, 8, np.float64, False, [40, 20], bias=bias,
                    table_grad=True)  # fmt: skip
    check_attention(emulated(attention_splits=4), 1, 2, 1, 37, 45, 8, np.float32, True, [30], dropout=0.3)


def row_cases():
    """softmax.cu's and layer_norm.cu's row kernels (a warp a row, its lanes meeting in shuffles,
    several rows a block: no shared memory, so what is checked is that no two threads write one
    word), layer norm's column kernels, elementwise.cu's GELU and dropout. (The sanitizer takes
    about a millisecond to start a thread, and the emulator starts one per CUDA thread: the arrays
    are small.)"""
    import test_cuda_kernels as t

    kernels = t.emulated()
    rng = np.random.default_rng(0)
    for kind in t.KINDS:
        for dtype in t.DTYPES:
            x = rng.standard_normal((4, 70)).astype(dtype)
            t.check(kernels, kind, x, t.mixed_lens(4, 70), rng.standard_normal((4, 70)).astype(dtype))
    t.test_layer_norm_matches_the_cpu_kernels(kernels, np.float32, (5, 33))
    t.test_gelu_matches_its_reference(kernels, np.float32)
    t.test_dropout_masks_are_the_cpus_bit_for_bit(kernels, np.float32, 0.5, 777)


def multi_tensor_cases():
    """multi_tensor.cu: Adam's update of a list, the gradients' norm (a block's partial sums meet in
    shared memory) and their scaling, over chunks of every kind and a grid that strides."""
    import test_multi_tensor as t

    t.test_adam_update_multi_is_the_per_parameter_kernel_bit_for_bit(t.emulated(), np.float32, t.SIZES[3], 0.999)
    t.test_the_norm_is_the_same_bits_at_every_run_and_factor_one_below_max_norm(t.emulated(threads=32), np.float64)
    t.test_hypothesis_lists_against_numpy.hypothesis.inner_test(
        sizes=[0, 7, 53, 1, 17], dtype=np.float32, threads=32, chunk=7, max_blocks=2, decay=0.999
    )


CASES = {"attention": attention_cases, "rows": row_cases, "multi_tensor": multi_tensor_cases}


@pytest.mark.parametrize("source", sorted(CASES))
def test_the_kernels_have_no_data_races(source):
    """``CASES[source]`` in a race-checked process: the values right and no report, with all the
    blocks of every launch run at once (no launch larger than one wave of the emulator)."""
    done = race_checked(
        f"import test_cuda_races\ntest_cuda_races.CASES[{source!r}]()\n"
        "from cuda_emulator import EmulatedKernel\nprint('checked', EmulatedKernel.most_threads)"
    )
    assert done.returncode == 0 and "checked" in done.stdout, report(done)
    most_threads = int(done.stdout.split()[-1])
    assert 0 < most_threads <= cuda_emulator.WAVE_THREADS, f"a launch of {most_threads} threads ran in waves"
