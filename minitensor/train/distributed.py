"""Data parallelism over MPI: N processes train one model, each on its shard of every minibatch.

    mpiexec -n 2 minitensor train            # or: minitensor train --workers 2

Every rank builds the same model from the same seed, and rank 0's parameters are broadcast so
that they start identical whatever happened before. Each step, every rank takes its rows of
the global minibatch (the same global minibatch one process would take), runs forward and
backward on them, and the ranks then **all-reduce** their gradients: afterwards every rank
holds the gradient of the global loss, so their optimisers take identical steps and the
replicas never drift apart (D2L 12.5 / 13.5, "Training on Multiple GPUs").

The loss is a *mean over valid target tokens*, and the ranks hold different numbers of them
(padding differs from row to row). With n_r tokens on rank r, N = sum_r n_r, and g_r the
gradient of rank r's own mean loss, the global loss is sum_r (n_r / N) loss_r, so

    g = sum_r (n_r / N) g_r

which is what ``allreduce_gradients`` computes: each rank scales its gradient by n_r, one
MPI_Allreduce sums the scaled gradients, and every rank divides by N. (A plain average,
(1/R) sum_r g_r, would weigh a token on a rank with few tokens more than one on a rank with
many, and differ from one process.) Gradient clipping and the optimiser step come after it,
on the global gradient.

The gradients travel in **buckets**: consecutive parameters packed into one contiguous host
buffer of up to ``BUCKET_BYTES``, one Allreduce per bucket, so that a model of many small
tensors costs a few large messages instead of one message per tensor (as PyTorch's DDP does).
On a GPU the buckets are host buffers too (copied from and back to the device): correct with
any MPI, at the cost of the copies; NCCL would reduce on the GPUs directly.

MPI comes from the ``dist`` extra (``pip install -e ".[dist]"``: mpi4py and the MPICH wheel,
which brings ``mpiexec``); a single process never imports it.
"""

import os
import sys

import numpy

from .. import Tensor

BUCKET_BYTES = 4 << 20  # 4 MiB of gradients per Allreduce (PyTorch's DDP uses 25 MiB buckets)

# What MPI launchers set in every process they start: MPICH/Hydra (PMI_*, MPI_LOCAL*), Open MPI, PMIx.
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "PMI_LOCAL_RANK")

DIST_EXTRA = 'pip install -e ".[dist]"'


class DistributedError(RuntimeError):
    """Data-parallel training cannot start: MPI is missing, or the launch does not add up."""


def _from_launcher(names, default):
    """The first of the environment variables ``names`` an MPI launcher set, as an int, else ``default``."""
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return default


def launched_size():
    """The number of processes an MPI launcher started this one among (1 when not launched)."""
    return _from_launcher(_SIZE_VARIABLES, 1)


def launched_rank():
    """This process's rank as the MPI launcher numbered it (0 when not launched), before MPI starts."""
    return _from_launcher(_RANK_VARIABLES, 0)


def import_mpi():
    """mpi4py's MPI module, or a DistributedError that names the extra to install."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(
            f"data-parallel training needs MPI, which is not installed ({e}): {DIST_EXTRA}"
        ) from None
    return MPI


class World:
    """The processes training one model together: MPI's COMM_WORLD, or this process alone.

    ``rank`` (0 .. ``size`` - 1) and ``size``; rank 0 (``is_main``) alone prints and writes.
    """

    def __init__(self, comm=None):
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1

    @property
    def is_main(self):
        """Rank 0: the process that logs, draws the progress bar and writes checkpoints."""
        return self.rank == 0

    def sum(self, values):
        """The element-wise sum over the ranks of a float64 vector (every rank gets it)."""
        values = numpy.ascontiguousarray(values, dtype=numpy.float64)
        if self.comm is None:
            return values
        out = numpy.empty_like(values)
        self.comm.Allreduce(values, out)
        return out

    def allreduce_(self, buffer):
        """Sum the contiguous NumPy ``buffer`` over the ranks, in place."""
        if self.comm is not None:
            self.comm.Allreduce(import_mpi().IN_PLACE, buffer)

    def broadcast_(self, buffer):
        """Overwrite the contiguous NumPy ``buffer`` with rank 0's, in place."""
        if self.comm is not None:
            self.comm.Bcast(buffer, root=0)

    def barrier(self):
        if self.comm is not None:
            self.comm.Barrier()

    def abort(self, code):
        """End every process of the job (after this rank has said why): no rank is left waiting
        in a collective that will never complete."""
        sys.stdout.flush()
        sys.stderr.flush()
        if self.comm is not None:
            self.comm.Abort(code)


def world():
    """The World this process is part of: COMM_WORLD when an MPI launcher started several
    processes, else a world of one."""
    return World(import_mpi().COMM_WORLD) if launched_size() > 1 else World()


def local_rank():
    """This process's index among those of the job on the same host (None if the launcher says not)."""
    return _from_launcher(_LOCAL_RANK_VARIABLES, None)


def select_gpu(ranks, cupy=None):
    """On ``device="cuda"``, each rank its own GPU: the local rank (else the rank) modulo the
    host's GPUs, made CuPy's current device before anything is allocated. Returns its index."""
    if cupy is None:
        import cupy  # lazy: the gpu extra
    index = (local_rank() if local_rank() is not None else ranks.rank) % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(index).use()
    return index


# ``--workers N --oversubscribe``: at most this many processes per CPU. Past one per CPU every
# process waits for a core (a speed-up turns into a slow-down); past a few, the machine spends
# its memory and time on processes that cannot run at once.
OVERSUBSCRIBE_FACTOR = 4


def usable_cpus():
    """The CPUs this process may run on: its affinity mask (which ``taskset``, a container's
    cpuset or a batch scheduler narrows), else the machine's count where there is no mask."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity mask
        return os.cpu_count() or 1


def check_local_workers(workers, oversubscribe=False):
    """Refuse ``--workers N`` (N processes started here by ``mpiexec -n N``) when N is more than
    the CPUs this process may use, or than ``OVERSUBSCRIBE_FACTOR`` times as many with
    ``--oversubscribe``; checked before anything is started. More processes than that belong
    on several hosts, which ``mpiexec`` itself starts with a host file."""
    cpus = usable_cpus()
    limit = cpus * OVERSUBSCRIBE_FACTOR if oversubscribe else cpus
    if workers <= limit:
        return
    across_hosts = f"`mpiexec -n {workers} -f HOSTFILE minitensor train ...` (no --workers; see docs/guide.md)"
    if oversubscribe:
        raise DistributedError(
            f"--workers {workers} --oversubscribe: at most {limit} processes here ({OVERSUBSCRIBE_FACTOR} per "
            f"CPU, {cpus} CPUs this process may use); to train on {workers} processes run {across_hosts}"
        )
    expert = (
        f", add --oversubscribe (up to {cpus * OVERSUBSCRIBE_FACTOR} here)"
        if workers <= cpus * OVERSUBSCRIBE_FACTOR
        else ""
    )
    raise DistributedError(
        f"--workers {workers} would start {workers} training processes on the {cpus} CPUs this process may "
        f"use (os.sched_getaffinity): give --workers {cpus} or fewer{expert}, or across hosts run {across_hosts}"
    )


def check_workers(workers):
    """Refuse ``--workers N`` given to a process that an MPI launcher started as one of another number."""
    size = launched_size()
    if size > 1 and workers != size:
        raise DistributedError(
            f"--workers {workers} but mpiexec started {size} processes: give one of them (`minitensor train "
            f"--workers {workers} ...` starts mpiexec itself; `mpiexec -n {size} minitensor train ...` "
            "needs no --workers)"
        )


# -- the model's parameters and gradients, as host buffers ------------------------------------------
def _host(p, array):
    """A NumPy copy of ``array``, an array of parameter ``p``'s backend (a GPU's: copied to the host)."""
    return p._backend.to_numpy(array)


def _back(p, host):
    """``host`` as an array of parameter ``p``'s backend (a GPU's: copied to the device)."""
    return p._backend.xp.asarray(host)


def _pieces(group, flat):
    """(p, the part of the flat buffer ``flat`` that holds p, in p's shape) for each p of ``group``,
    packed one after another."""
    offset = 0
    for p in group:
        n = p.data.size
        yield p, flat[offset : offset + n].reshape(p.data.shape)
        offset += n


def buckets(params, bucket_bytes=BUCKET_BYTES):
    """Consecutive parameters grouped so that each group's gradients fill at most
    ``bucket_bytes`` (a larger parameter is a bucket of its own), one dtype per bucket."""
    groups, current, size = [], [], 0
    for p in params:
        nbytes = p.data.size * p.data.dtype.itemsize
        if current and (size + nbytes > bucket_bytes or p.data.dtype != current[0].data.dtype):
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        groups.append(current)
    return groups


def broadcast_parameters(params, world):
    """Make every rank's parameters rank 0's (they start identical, whatever each rank did)."""
    if world.size == 1:
        return
    for group in buckets(params):
        flat = numpy.concatenate([_host(p, p.data).ravel() for p in group])
        world.broadcast_(flat)
        for p, piece in _pieces(group, flat):
            p.data = _back(p, piece)


def allreduce_gradients(params, num_tokens, world, bucket_bytes=BUCKET_BYTES):
    """Replace each rank's gradients (of its own mean loss over ``num_tokens`` tokens) by the
    gradient of the global mean loss, g = sum_r n_r g_r / sum_r n_r, on every rank; returns N,
    the global token count.

    A parameter without a gradient on any rank keeps none (as in one process); one with a
    gradient on some ranks only (a rank whose shard was empty) counts zeros elsewhere."""
    params = list(params)
    if world.size == 1:
        return num_tokens
    present = numpy.array([p.grad is not None for p in params], dtype=numpy.float64)
    totals = world.sum(numpy.concatenate([[num_tokens], present]))
    total, anywhere = totals[0], totals[1:] > 0
    if total == 0:
        return 0
    for group in buckets([p for p, used in zip(params, anywhere) if used], bucket_bytes):
        flat = numpy.empty(sum(p.data.size for p in group), dtype=group[0].data.dtype)
        for p, piece in _pieces(group, flat):
            piece[...] = 0 if p.grad is None else _host(p, p.grad.data)
        flat *= num_tokens  # n_r g_r ...
        world.allreduce_(flat)  # ... summed over the ranks ...
        flat /= total  # ... over N
        for p, piece in _pieces(group, flat):
            grad = _back(p, piece)
            if p.grad is None:
                p.grad = Tensor._make(grad, p._backend, None)
            else:
                p.grad.data = grad
    return int(total)


def rank_seed(seed, rank, step):
    """The seed of rank ``rank``'s random stream (dropout) from step ``step`` on: different for
    every rank, the same for the same (seed, rank, step), so a run is reproducible."""
    return int(numpy.random.SeedSequence([seed, rank, step]).generate_state(1, numpy.uint64)[0] >> 1)
