"""Shared test setup: the "strict" device, the ``device`` fixture, the GPU switch.

Every op test that takes ``device`` runs on "cpu" (NumPy) and on "strict", a backend whose
arrays refuse implicit conversion to NumPy as CuPy's do (``tests/strict_backend.py``): an
op that reaches for ``numpy`` on tensor data passes on "cpu" and fails on "strict". Where
CuPy finds a usable GPU, the same tests also run on "cuda" (marked ``gpu``: ``pytest -m gpu``
runs just those); elsewhere the tests' CUDA emulator runs the CUDA kernels
(``tests/cuda_emulator``), so they are tested on every machine.
"""

import os
import pathlib
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

from gpu import GPU  # noqa: E402
from strict_backend import StrictArray, StrictBackend  # noqa: E402,F401

# A property test checks results, never speed: on a loaded machine (CI's 2 cores beside other
# work) no example may fail for taking long (Hypothesis's per-example deadline) or for being
# slow to generate (its too_slow health check). A test's own @settings still sets the rest.
settings.register_profile("minitensor", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("minitensor")

DEVICES = ["cpu", "strict", pytest.param("cuda", marks=[pytest.mark.gpu])] if GPU else ["cpu", "strict"]


def _register_strict():
    backends = sys.modules["minitensor.backends"]
    if "strict" not in backends.available_backends():
        backends.register_backend(StrictBackend())


_register_strict()


@pytest.fixture(autouse=True)
def _strict_registered():
    """Keep "strict" registered even if some test rebuilt the backend registry."""
    _register_strict()


@pytest.fixture
def recorded():
    """The kernel launches of a ``CudaKernels(..., load_module=RecordingModule)``, recorded from now."""
    from cuda_emulator import RecordingModule

    RecordingModule.launches = []
    return RecordingModule.launches


@pytest.fixture(params=DEVICES)
def device(request):
    """The device name an op test runs on: "cpu", "strict" (and "cuda" on a GPU)."""
    return request.param


# The full tier alone: ``python -m pytest -q -n auto -m "not slow"`` is a
# contributor's quick loop; CI runs everything. Slow are whole files that build the docs
# site, run the tutorials, drive a browser, start MPI jobs, export to ONNX Runtime or run a
# benchmark's smoke test; and, marked in their files, the wheel builds (test_packaging.py).
SLOW_FILES = {
    "test_docs.py",  # builds the site from the tutorial runs
    "test_tutorials.py",  # runs every tutorial (smoke mode)
    "test_tutorials_zh.py",
    "test_viz_browser.py",  # Chromium
    "test_distributed.py",  # mpiexec
    "test_onnx.py",  # trains, exports and runs a model in ONNX Runtime
    "test_gpu_check.py",  # benchmark smoke runs, in subprocesses
    "test_cuda_races.py",  # the CUDA kernels again, built with ThreadSanitizer, in subprocesses
    "test_bench_data_parallel.py",
    "test_bench_gpt_char.py",
    "test_bench_long_attention.py",
    "test_bench_plugin_paths.py",
}


# The README's test command runs the suite on pytest-xdist's workers, ``-n auto``: each worker a
# process of its own, handed whole test files, so that a module's fixtures are made once. The
# files that share one of the expensive session fixtures below go to one worker together, so
# that it is made once too (the tutorials' runs, about three minutes on 2 cores, and a trained
# model). A file whose tests take one of them must be listed here (checked at collection).
SHARED_SESSION_FIXTURES = {
    "tutorial_runs": ("test_docs.py", "test_tutorials.py"),
    "trained_run": ("test_viz_page.py", "test_viz_browser.py"),
}
MAX_WORKERS = 4


def usable_cores():
    """The cores this process may run on (a container or taskset may allow fewer than the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker for each core this process may use, at most ``MAX_WORKERS``; each
    worker's tests start processes of their own (the tutorials, mpiexec, a browser), and a core
    already runs a worker. PYTEST_XDIST_AUTO_NUM_WORKERS asks for fewer (or, up to the cores, more)."""
    cores = usable_cores()
    asked = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    return max(1, min(int(asked), cores)) if asked and asked.isdigit() else min(cores, MAX_WORKERS)


def pytest_configure(config):
    """On a worker: BLAS gets this worker's share of the cores, and so do the processes its tests
    start (the tutorials, ``minitensor train``). Otherwise each of two workers' OpenBLAS starts a
    thread a core, and on 2 cores four threads, spinning while they wait for work, take turns on
    two. numba keeps a thread a core, so that the tests still run its kernels in parallel (and the
    benchmarks' smoke runs can ask for 2), but its threads sleep while they wait
    (OMP_WAIT_POLICY, read when numba first starts them)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        from threadpoolctl import threadpool_limits

        share = max(1, usable_cores() // workers)
        config._blas_threads = threadpool_limits(share, user_api="blas")
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(share))  # for the processes the tests start
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def work_unit(nodeid):
    """What one worker runs whole, for a test id: its file, or the shared session fixture whose
    files include it."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    return next((fixture for fixture, files in SHARED_SESSION_FIXTURES.items() if name in files), path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before pytest-xdist's own, the fallback
def pytest_xdist_make_scheduler(config, log):
    """``-n`` alone (pytest-xdist's ``--dist load``) hands out ``work_unit``s rather than single
    tests; a ``--dist`` asked for by another name gets pytest-xdist's own scheduler."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndSharedFixtures(LoadScopeScheduling):
        def _split_scope(self, nodeid):  # LoadScopeScheduling's grouping, as its loadfile subclass does
            return work_unit(nodeid)

    return FilesAndSharedFixtures(config, log)


def pytest_collection_modifyitems(items):
    """Mark ``slow`` the tests of SLOW_FILES. On a GPU, the tests that take the ``cuda`` fixture
    (test_cuda_backend.py) run on the real device: mark them ``gpu`` so that ``pytest -m gpu``
    includes them. A test that takes a shared session fixture must be in one of its files, or
    the workers would each make the fixture."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if GPU and "cuda" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)
        for fixture, files in SHARED_SESSION_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and item.path.name not in files:
                raise pytest.UsageError(
                    f"{item.nodeid} takes the session fixture {fixture}, which {', '.join(files)} share: "
                    f"add {item.path.name} to SHARED_SESSION_FIXTURES[{fixture!r}] in tests/conftest.py, "
                    "so that one worker runs the files that make it"
                )


# A small Transformer trained once per test session, for the tests that need a trained model
# (the explain page in a browser, ...): the reverse task, 2 blocks of 4 heads, one epoch.
TRAINED_RUN = ["--task", "reverse", "--num-train", "128", "--num-heldout", "8", "--max-len", "5"]
TRAINED_RUN += ["--batch-size", "32", "--num-blks", "2", "--num-hiddens", "16", "--ffn-num-hiddens", "32"]
TRAINED_RUN += ["--num-heads", "4", "--epochs", "1", "--no-progress"]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """The run folder of ``TRAINED_RUN``, trained by ``minitensor train`` as a user would."""
    import subprocess

    home = tmp_path_factory.mktemp("trained")
    done = subprocess.run(
        [sys.executable, "-m", "minitensor", "train", *TRAINED_RUN, "--out", "run"],
        capture_output=True,
        text=True,
        cwd=home,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return home / "run"


ROOT = pathlib.Path(__file__).resolve().parent.parent


class TutorialRuns:
    """Each tutorial, in each language, run once per test session in smoke mode.

    ``docs/_hooks/render_tutorial.py`` runs it (as ``python tutorial.py`` would) and writes its
    page for the documentation site. tests/test_tutorials.py checks the run, tests/test_docs.py
    builds the site from the pages: a tutorial is never run twice for the two.
    """

    def __init__(self, folder):
        self.folder = folder  # <folder>/<lang>/<stem>.md and <folder>/<lang>/<stem>/*.png
        self.done = {}

    def run(self, path):
        from helpers import load_module

        lang = "zh" if path.parent.name == "zh" else "en"
        if (lang, path.stem) not in self.done:
            render = load_module(ROOT / "docs/_hooks/render_tutorial.py", "render_tutorial")
            self.done[lang, path.stem] = render.run_in_subprocess(path, self.folder / lang, timeout=300)
        return self.done[lang, path.stem]


@pytest.fixture(scope="session")
def tutorial_runs(tmp_path_factory):
    return TutorialRuns(tmp_path_factory.mktemp("tutorials"))
