"""Data parallelism over MPI (``minitensor/train/distributed.py``): N processes train one model.

The promise is that N processes train *the same model* one process would, on the same global
minibatches: every rank takes its shard of each minibatch, and the all-reduce weighs each rank's
gradient by its number of target tokens, g = sum_r n_r g_r / N. Tested here:

- the pieces, in this process and without MPI: ``shard_bounds`` and ``Batches(shard=...)``,
  ``buckets``, ``rank_seed``, and ``allreduce_gradients`` / ``broadcast_parameters`` between
  two ranks that are threads (their collectives meet at a barrier, as MPI's do), on NumPy, on
  the strict backend and on the CuPy stand-in (gradients cross through host buffers);
- the real thing, under the MPICH wheel's ``mpiexec``: ``minitensor train --workers 2`` against
  one process (float32, 1e-5), a float64 training script (1e-12, where a plain average of the
  ranks' gradients is far off), a run resumed with another number of processes, a rank that
  raises (the job ends with its message instead of hanging), and the launch errors.

The multi-process tests skip where mpi4py or mpiexec is missing, except under ``CI=true``
(``.ci/run`` installs the ``dist`` extra), where that is a failure: CI must really run them.
"""

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
from fake_cupy import fake_cuda_backend
from gpu import GPU
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
from minitensor import backends, cli
from minitensor.data import Batches
from minitensor.data.batching import shard_bounds
from minitensor.train import distributed
from minitensor.train.distributed import (
    DIST_EXTRA,
    OVERSUBSCRIBE_FACTOR,
    World,
    allreduce_gradients,
    broadcast_parameters,
    buckets,
    launched_size,
    rank_seed,
)

# What MPI launchers put in the environment of the processes they start: a test process that
# inherited them (run under mpiexec itself) would take every command below for one rank of N.
LAUNCHER_VARIABLES = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


def _mpiexec():
    """The mpiexec that ``minitensor train --workers N`` would start (beside Python, else on PATH),
    or a skip where mpi4py or mpiexec is missing (a failure under CI=true)."""
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    mpiexec = shutil.which("mpiexec", path=search)
    if importlib.util.find_spec("mpi4py") is not None and mpiexec is not None:
        return mpiexec
    message = f"needs mpi4py and mpiexec (the dist extra: {DIST_EXTRA})"
    if os.environ.get("CI") == "true":
        pytest.fail("under CI=true the multi-process tests must run: " + message)
    pytest.skip(message)


def _env():
    """The environment of a training subprocess: one BLAS thread per process (2 ranks share the
    cores), and no launcher variables inherited from whatever started pytest."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[name] = "1"
    return env


def minitensor(*args, cwd, timeout=120):
    """``minitensor ARGS`` in a new process, as a user runs it; the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "minitensor", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(),
        timeout=timeout,
    )


def ok(result):
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result


# A tiny run. 120 examples in minibatches of 27: 5 steps per epoch, the fifth of 12 rows only;
# on 2 ranks every minibatch splits unevenly (14 + 13 rows, then 6 + 6), and the ranks hold
# different numbers of target tokens (the reverse task's examples differ in length).
TINY = ["--task", "reverse", "--num-train", "120", "--num-heldout", "8", "--max-len", "5", "--batch-size", "27"]
TINY += ["--num-hiddens", "16", "--ffn-num-hiddens", "32", "--num-blks", "1", "--num-heads", "2", "--no-progress"]


def _checkpoint(run):
    """(model tensors by name, checkpoint.json) of the run folder ``run``'s latest checkpoint."""
    from safetensors.numpy import load_file

    folder = run / "checkpoint"
    return load_file(str(folder / "model.safetensors")), json.loads((folder / "checkpoint.json").read_text())


def _max_difference(a, b):
    """The largest absolute difference between two {name: array} of the same names and shapes."""
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape and a[name].dtype == b[name].dtype, name
    return max(float(np.max(np.abs(a[name].astype(np.float64) - b[name]))) for name in a)


# -- shard_bounds and Batches(shard=) ---------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5000), size=st.integers(1, 70))
def test_shard_bounds_cut_n_rows_into_contiguous_parts_that_differ_by_at_most_one(n, size):
    parts = [shard_bounds(n, rank, size) for rank in range(size)]
    assert parts[0][0] == 0 and parts[-1][1] == n
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(parts, parts[1:]))  # contiguous
    lengths = [stop - start for start, stop in parts]
    assert min(lengths) >= 0 and max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the longer parts first, as documented
    covered = np.concatenate([np.arange(start, stop) for start, stop in parts])
    np.testing.assert_array_equal(covered, np.arange(n))  # every row exactly once, in order


def _rows(n):
    """Two arrays whose rows say which example they are."""
    return np.arange(n * 3).reshape(n, 3), np.arange(n) * 10


@pytest.mark.parametrize(
    "n, batch_size, size, drop_last",
    [(50, 8, 2, False), (50, 8, 3, True), (23, 7, 4, False), (7, 3, 5, False)],  # the last: empty shards
)
def test_sharded_batches_are_the_rows_of_the_global_minibatch(n, batch_size, size, drop_last):
    """Every rank's minibatch is its shard_bounds part of the minibatch one process would take,
    over epoch boundaries, and every rank's position in the data is the global one."""
    arrays = _rows(n)

    def loader(shard=None):
        rng = np.random.default_rng(3)  # the same seed: the same epochs' orders
        return Batches(*arrays, batch_size=batch_size, drop_last=drop_last, rng=rng, shard=shard)

    whole = loader()
    shards = [loader((rank, size)) for rank in range(size)]
    assert all(len(s) == len(whole) for s in shards)
    seen = 0
    for _ in range(2):  # two epochs: the second in another order
        for batch, *parts in zip(whole, *shards):
            rows = len(batch[0])
            for rank, part in enumerate(parts):
                start, stop = shard_bounds(rows, rank, size)
                for array, piece in zip(batch, part):
                    np.testing.assert_array_equal(piece.numpy(), array.numpy()[start:stop])
            for i, array in enumerate(batch):
                np.testing.assert_array_equal(np.concatenate([part[i].numpy() for part in parts]), array.numpy())
            assert all(s.state_dict() == whole.state_dict() for s in shards)
            seen += 1
    assert seen == 2 * len(whole)

    # a position saved by one process resumes on any number of them with the very next rows
    whole, resumed = loader(), loader((1, size))
    next(iter(whole)), next(iter(whole))
    resumed.load_state_dict(whole.state_dict())
    batch, part = next(iter(whole)), next(iter(resumed))
    start, stop = shard_bounds(len(batch[0]), 1, size)
    np.testing.assert_array_equal(part[0].numpy(), batch[0].numpy()[start:stop])
    assert resumed.state_dict() == whole.state_dict()


def test_a_shard_must_be_a_rank_below_the_size():
    for shard in [(2, 2), (-1, 2), (0, 0)]:
        with pytest.raises(ValueError, match="shard"):
            Batches(np.arange(4), batch_size=2, shard=shard)


# -- buckets, rank_seed, launched_size --------------------------------------------------------------
def _parameter(size, dtype="float32"):
    return mt.nn.Parameter(np.zeros(size, dtype=dtype))


def _nbytes(group):
    return sum(p.data.size * p.data.dtype.itemsize for p in group)


@settings(max_examples=100, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 64), st.sampled_from(["float32", "float64"])), max_size=20),
    limit=st.integers(1, 400),
)
def test_buckets_keep_the_order_one_dtype_and_the_byte_limit(shapes, limit):
    params = [_parameter(size, dtype) for size, dtype in shapes]
    groups = buckets(params, limit)
    assert [p for group in groups for p in group] == params  # the order, every parameter once
    for group in groups:
        assert group and len({p.data.dtype for p in group}) == 1
        assert _nbytes(group) <= limit or len(group) == 1  # over the limit: a parameter alone
    for group, following in zip(groups, groups[1:]):  # full: the next parameter would not fit
        first = following[0]
        assert first.data.dtype != group[0].data.dtype or _nbytes(group) + _nbytes([first]) > limit


def test_buckets_put_a_large_parameter_alone():
    small, large = _parameter(10), _parameter(1000)
    groups = buckets([small, _parameter(10), large, _parameter(10), _parameter(5, "float64")], bucket_bytes=100)
    assert [len(g) for g in groups] == [2, 1, 1, 1] and groups[1] == [large] and groups[0][0] is small


def test_rank_seed_differs_by_rank_and_step_and_is_reproducible():
    seeds = {(rank, step): rank_seed(0, rank, step) for rank in range(4) for step in range(0, 40, 7)}
    assert len(set(seeds.values())) == len(seeds)
    assert all(rank_seed(0, rank, step) == seed for (rank, step), seed in seeds.items())
    assert rank_seed(1, 1, 0) != rank_seed(0, 1, 0)
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds.values())
    mt.manual_seed(rank_seed(0, 1, 5))  # a seed manual_seed takes


def test_launched_size_reads_the_launchers_variables(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert launched_size() == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert launched_size() == 3
    monkeypatch.setenv("PMI_SIZE", "2")  # MPICH's Hydra, the wheel's mpiexec
    assert launched_size() == 2


# -- the collectives between two ranks that are threads ---------------------------------------------
class ThreadWorld:
    """Rank ``rank`` of ``len(slots)`` ranks that are threads of this process: a collective waits
    at a barrier for every rank, as MPI's do (and times out instead of hanging when a rank skips
    one). ``calls`` records this rank's collectives: (name, dtype, length)."""

    def __init__(self, rank, barrier, slots):
        self.rank, self.size = rank, len(slots)
        self._barrier, self._slots = barrier, slots
        self.calls = []

    @property
    def is_main(self):
        return self.rank == 0

    def _gather(self, values):
        self._slots[self.rank] = np.array(values, copy=True)
        self._barrier.wait()
        everyone = list(self._slots)
        self._barrier.wait()  # every rank has read before the next collective writes
        return everyone

    def sum(self, values):
        values = np.ascontiguousarray(values, dtype=np.float64)
        self.calls.append(("sum", values.dtype, values.size))
        return sum(self._gather(values))

    def allreduce_(self, buffer):
        self.calls.append(("allreduce", buffer.dtype, buffer.size))
        buffer[...] = sum(self._gather(buffer))

    def broadcast_(self, buffer):
        self.calls.append(("broadcast", buffer.dtype, buffer.size))
        buffer[...] = self._gather(buffer)[0]


def on_two_ranks(work):
    """``work(world)`` on two ThreadWorld ranks at once; their results, rank by rank."""
    barrier, slots = threading.Barrier(2, timeout=20), [None, None]
    worlds = [ThreadWorld(rank, barrier, slots) for rank in range(2)]
    results, errors = [None, None], []

    def run(world):
        try:
            results[world.rank] = work(world)
        except BaseException as e:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(w,)) for w in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results, worlds


@pytest.fixture(params=["cpu", "strict", "cuda"])
def backend(request, monkeypatch):
    """A device for the collectives' tests; "cuda" is the CuPy backend on the CuPy stand-in
    (on a real GPU: the real one)."""
    if request.param == "cuda" and not GPU:
        monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    return request.param


class Tiny(mt.nn.Module):
    """Three parameters: ``w`` used by every rank, ``b`` only when ``use_b``, ``unused`` never."""

    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = mt.nn.Parameter(rng.standard_normal((4, 3)))
        self.b = mt.nn.Parameter(rng.standard_normal(3))
        self.unused = mt.nn.Parameter(rng.standard_normal(2))

    def forward(self, x, use_b):
        y = x @ self.w
        return y + self.b if use_b else y


def _rank_gradients(device, rank):
    """(model, n_r, {name: g_r as NumPy}) of rank ``rank``: its own rows, its own mean loss."""
    model = Tiny(seed=0).double().to(device)
    rows = [5, 2][rank]  # different token counts: a plain average of the gradients would be wrong
    x = mt.tensor(np.random.default_rng(10 + rank).standard_normal((rows, 4)), device=device)
    ((model(x, use_b=rank == 0) ** 2).sum() / rows).backward()  # the mean over this rank's rows
    grads = {name: None if p.grad is None else p.grad.numpy() for name, p in model.named_parameters()}
    return model, rows, grads


def test_allreduce_gradients_weighs_each_ranks_gradient_by_its_tokens(backend):
    """g = sum_r n_r g_r / N on every rank, as arrays of the parameters' own backend; a gradient
    that no rank has stays None, and one that some rank lacks counts as zeros there."""
    ranks = [_rank_gradients(backend, rank) for rank in range(2)]
    (n0, n1), N = (ranks[0][1], ranks[1][1]), ranks[0][1] + ranks[1][1]
    g0, g1 = ranks[0][2], ranks[1][2]
    assert g1["b"] is None and g0["unused"] is None and g1["unused"] is None
    expected = {"w": (n0 * g0["w"] + n1 * g1["w"]) / N, "b": n0 * g0["b"] / N}

    # a bucket of 100 bytes: w (96 bytes) and b (24) travel in two Allreduces
    totals, worlds = on_two_ranks(
        lambda world: allreduce_gradients(
            ranks[world.rank][0].parameters(), ranks[world.rank][1], world, bucket_bytes=100
        )
    )
    assert totals == [N, N]
    for (model, _, _), world in zip(ranks, worlds):
        params = dict(model.named_parameters())
        assert params["unused"].grad is None
        for name, value in expected.items():
            grad = params[name].grad
            assert grad.device == backend and type(grad.data) is type(params[name].data), name
            assert grad.dtype == mt.float64 and grad.shape == params[name].shape
            np.testing.assert_allclose(grad.numpy(), value, rtol=1e-14, atol=1e-15)
        assert [c[0] for c in world.calls] == ["sum", "allreduce", "allreduce"]
        assert [c[2] for c in world.calls[1:]] == [12, 3]
    plain = (g0["w"] + g1["w"]) / 2
    assert np.max(np.abs(plain - expected["w"])) > 1e-3  # the weighting matters here


def test_allreduce_gradients_when_no_rank_has_tokens_changes_nothing(backend):
    def work(world):
        model = Tiny(seed=0).double().to(backend)
        return allreduce_gradients(model.parameters(), 0, world), [p.grad for p in model.parameters()]

    results, _ = on_two_ranks(work)
    assert [total for total, _ in results] == [0, 0]
    assert all(g is None for _, grads in results for g in grads)


def test_one_process_keeps_its_own_gradients():
    model, rows, grads = _rank_gradients("cpu", 0)
    before = [p.grad for p in model.parameters()]
    assert allreduce_gradients(model.parameters(), rows, World()) == rows
    assert [p.grad for p in model.parameters()] == before  # not even copied
    assert World().sum([1.0, 2.0]).tolist() == [1.0, 2.0]


def test_broadcast_parameters_makes_every_rank_rank_0(backend):
    def work(world):
        model = Tiny(seed=world.rank).double().to(backend)  # different on each rank
        broadcast_parameters(model.parameters(), world)
        return model

    (first, second), _ = on_two_ranks(work)
    reference = Tiny(seed=0).double()
    for (name, p), q, r in zip(first.named_parameters(), second.parameters(), reference.parameters()):
        assert p.device == q.device == backend and type(q.data) is type(p.data), name
        np.testing.assert_array_equal(q.numpy(), r.numpy())
        np.testing.assert_array_equal(p.numpy(), r.numpy())


# -- N = 2 processes train what one process trains -----------------------------------------------
def test_two_workers_train_the_same_float32_model_as_one_process(tmp_path):
    _mpiexec()  # --workers finds it itself
    pytest.importorskip("safetensors")
    one = ok(minitensor("train", *TINY, "--steps", "5", "--out", "one", cwd=tmp_path))
    two = ok(minitensor("train", *TINY, "--steps", "5", "--out", "two", "--workers", "2", cwd=tmp_path))
    assert "2 workers" in two.stdout.splitlines()[0] and "workers" not in one.stdout.splitlines()[0]
    assert two.stdout.count("minitensor train:") == 1  # rank 0 alone speaks
    (weights_one, info_one), (weights_two, info_two) = _checkpoint(tmp_path / "one"), _checkpoint(tmp_path / "two")
    assert info_one["config"]["workers"] == 1 and info_two["config"]["workers"] == 2
    assert info_one["step"] == info_two["step"] == 5
    difference = _max_difference(weights_one, weights_two)
    losses_one, losses_two = info_one["extra"]["history"]["loss"], info_two["extra"]["history"]["loss"]
    loss_difference = max(abs(a - b) for a, b in zip(losses_one, losses_two))
    print(
        f"\nfloat32, 5 steps, 1 vs 2 processes: parameters differ by at most {difference:.3g}, "
        f"losses by {loss_difference:.3g}"
    )
    assert difference <= 1e-5
    assert len(losses_one) == len(losses_two) == 5 and loss_difference <= 1e-5
    assert losses_one[-1] < losses_one[0]  # it trained: the parity is not that of untouched weights


# The float64 run: TrainConfig has no dtype, so a script trains the Transformer in float64 the way
# the loop does (shard, mean over valid tokens, all-reduce, clip, Adam), alone or as a rank.
FLOAT64_SCRIPT = """
import sys

import numpy

import minitensor as mt
from minitensor.data import Batches, seq2seq_arrays
from minitensor.ops.loss import cross_entropy
from minitensor.optim import clip_grad_norm_
from minitensor.train.config import TrainConfig, build_data, build_model
from minitensor.train.distributed import allreduce_gradients, broadcast_parameters, world

ranks = world()
config = TrainConfig(task="reverse", num_train=64, num_heldout=8, max_len=5, num_hiddens=16,
                     ffn_num_hiddens=32, num_blks=1, num_heads=2, batch_size=13).validate()
mt.manual_seed(0)
data = build_data(config)
model = build_model(config, data.src_vocab, data.tgt_vocab).double()
arrays = seq2seq_arrays(data.train, data.src_vocab, data.tgt_vocab, data.num_steps, data.tgt_num_steps)
# 64 examples in minibatches of 13: 7 + 6 rows a rank, and a last minibatch of 12 (6 + 6)
loader = Batches(*arrays, batch_size=13, rng=numpy.random.default_rng(7), shard=(ranks.rank, ranks.size))
broadcast_parameters(model.parameters(), ranks)
optimizer = mt.optim.Adam(model.parameters(), lr=1e-2)
params = list(model.parameters())
record = {"tokens": []}
for step, (enc_X, enc_len, dec_X, dec_len, Y) in enumerate(loader):
    if step == 5:
        break
    optimizer.zero_grad()
    loss = cross_entropy(model(enc_X, dec_X, enc_len), Y, ignore_index=data.tgt_vocab.pad)
    assert loss.dtype == mt.float64
    num_tokens = int(dec_len.numpy().sum())  # this rank's valid target tokens
    record["tokens"].append(ranks.sum(numpy.eye(ranks.size)[ranks.rank] * num_tokens))
    loss.backward()
    if step == 0:  # what a plain average of the ranks' gradients would be
        for i, p in enumerate(params):
            g = p.grad.numpy()
            record[f"plain{i}"] = ranks.sum(g.ravel()).reshape(g.shape) / ranks.size
    allreduce_gradients(params, num_tokens, ranks)
    if step == 0:
        record.update({f"grad{i}": p.grad.numpy() for i, p in enumerate(params)})
    clip_grad_norm_(params, 1.0)
    optimizer.step()
record.update({f"param{i}": p.numpy() for i, p in enumerate(params)})
assert all(p.dtype == mt.float64 for p in params)
numpy.savez(f"{sys.argv[1]}.rank{ranks.rank}.npz", **record)
"""


def _arrays_of(record, prefix):
    return {k: record[k] for k in record.files if k.startswith(prefix)}


def test_two_ranks_train_the_same_float64_model_as_one_process(tmp_path):
    mpiexec = _mpiexec()
    script = tmp_path / "train64.py"
    script.write_text(FLOAT64_SCRIPT)
    run = dict(cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    ok(subprocess.run([sys.executable, str(script), "one"], **run))
    ok(subprocess.run([mpiexec, "-n", "2", sys.executable, str(script), "two"], **run))
    one, rank0, rank1 = (np.load(tmp_path / f"{name}.npz") for name in ("one.rank0", "two.rank0", "two.rank1"))

    tokens = rank0["tokens"]  # step by step: the tokens of rank 0 and of rank 1
    assert tokens.shape == (5, 2) and np.all(tokens[:, 0] != tokens[:, 1])  # the ranks' counts differ
    np.testing.assert_array_equal(tokens.sum(axis=1), one["tokens"][:, 0])  # together: the global minibatch

    grads, params = _arrays_of(one, "grad"), _arrays_of(one, "param")
    grad_difference = _max_difference(grads, _arrays_of(rank0, "grad"))
    plain_difference = _max_difference(
        grads, {k.replace("plain", "grad"): v for k, v in _arrays_of(rank0, "plain").items()}
    )
    difference = _max_difference(params, _arrays_of(rank0, "param"))
    print(
        f"\nfloat64, 5 steps, 1 vs 2 processes: parameters differ by at most {difference:.3g}; the first "
        f"gradient by {grad_difference:.3g} (a plain average of the ranks' gradients: {plain_difference:.3g})"
    )
    assert grad_difference <= 1e-12 and difference <= 1e-12
    assert plain_difference > 1e-6  # the weighting is tested: an unweighted mean is far off
    assert _max_difference(params, _arrays_of(rank1, "param")) <= 1e-12
    for name in params:  # the replicas hold the same parameters, bit for bit
        np.testing.assert_array_equal(rank0[name], rank1[name])


def test_a_run_resumes_with_another_number_of_processes(tmp_path):
    """3 steps on 2 processes, then 3 more on one: the model of 6 steps on one process (the run
    crosses an epoch boundary, so the global position in the data is resumed too)."""
    _mpiexec()
    pytest.importorskip("safetensors")
    run = [*TINY, "--schedule", "constant"]  # a cosine schedule would be stretched by the resume
    ok(minitensor("train", *run, "--steps", "3", "--out", "split", "--workers", "2", cwd=tmp_path))
    assert _checkpoint(tmp_path / "split")[1]["config"]["workers"] == 2
    resumed = ok(
        minitensor(
            "train", "--out", "split", "--resume", "--steps", "6", "--workers", "1", "--no-progress", cwd=tmp_path
        )
    )
    assert "resuming" in resumed.stdout and "at step 3" in resumed.stdout
    ok(minitensor("train", *run, "--steps", "6", "--out", "whole", cwd=tmp_path))
    (split, split_info), (whole, whole_info) = _checkpoint(tmp_path / "split"), _checkpoint(tmp_path / "whole")
    assert split_info["config"]["workers"] == 1 and split_info["step"] == whole_info["step"] == 6
    difference = _max_difference(split, whole)
    losses = zip(split_info["extra"]["history"]["loss"], whole_info["extra"]["history"]["loss"], strict=True)
    loss_difference = max(abs(a - b) for a, b in losses)
    print(
        f"\nresumed 3 steps on 2 processes + 3 on 1 vs 6 on 1: parameters differ by {difference:.3g}, "
        f"losses by {loss_difference:.3g}"
    )
    assert difference <= 1e-5 and loss_difference <= 1e-5


# -- a failing rank, and the launch errors ---------------------------------------------------------
RANK_BOMB = '''
import os

import minitensor as mt
from minitensor import hookimpl

RANK_1 = os.environ.get("PMI_RANK") == "1"
if RANK_1 and WHEN == "import":
    raise ValueError("rank one cannot load this plugin")


class RankBomb(mt.nn.Module):
    """The dot-product scorer, except on rank 1, where it raises."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        if RANK_1:
            raise ValueError("the scorer of rank one went off")
        return queries @ keys.swapaxes(-1, -2)


@hookimpl
def minitensor_scorers():
    return {"rank_bomb": RankBomb}
'''


@pytest.mark.parametrize(
    "when, message",
    [
        # rank 0 waits for rank 1 in the first step's all-reduce; rank 1 fails in its forward pass
        ("forward", "error: the scorer of rank one went off"),
        # rank 1 fails before anything else, loading a plugin (one missing on its host): rank 0
        # must not be left waiting for it in MPI_Init
        ("import", "ValueError: rank one cannot load this plugin"),
    ],
    ids=["in-its-forward-pass", "loading-a-plugin"],
)
def test_a_rank_that_raises_ends_the_job_with_its_message(tmp_path, when, message):
    """The job ends (MPI_Abort) with rank 1's one-line error, instead of hanging."""
    _mpiexec()
    (tmp_path / "rank_bomb.py").write_text(f"WHEN = {when!r}\n" + RANK_BOMB)
    args = ["train", *TINY, "--steps", "3", "--plugin", "./rank_bomb.py", "--scorer", "rank_bomb", "--workers", "2"]
    start = time.monotonic()
    job = subprocess.Popen(
        [sys.executable, "-m", "minitensor", *args],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: mpiexec and both ranks, ended together on a hang
    )
    try:
        stdout, stderr = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        pytest.fail("a rank raised and the job hung for 60 s instead of ending")
    elapsed = time.monotonic() - start
    print(f"\nrank 1 raised ({when}): the job ended after {elapsed:.1f} s, with status {job.returncode}")
    assert job.returncode != 0, stderr
    assert "minitensor train (rank 1 of 2): error: " in stderr and message in stderr, (job.returncode, stdout, stderr)
    assert "Traceback" not in stderr, stderr


def test_workers_without_mpi4py_names_the_extra_to_install(monkeypatch, capsys, tmp_path):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # find_spec("mpi4py") -> None, import -> ImportError
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *TINY, "--steps", "1", "--workers", "2"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("minitensor train: error: ") and DIST_EXTRA in err and "--workers 2" in err, err
    assert not (tmp_path / "runs").exists()


def _alone_with_mpi4py(monkeypatch):
    """This process as a user's: no MPI launcher around it, mpi4py "installed" (a stand-in)."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    fake = types.ModuleType("mpi4py")
    fake.__spec__ = importlib.machinery.ModuleSpec("mpi4py", None)
    monkeypatch.setitem(sys.modules, "mpi4py", fake)


def test_workers_without_mpiexec_says_so(monkeypatch, capsys, tmp_path):
    _alone_with_mpi4py(monkeypatch)  # but no mpiexec beside Python or on PATH
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *TINY, "--steps", "1", "--workers", "2"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mpiexec" in err and DIST_EXTRA in err, err


def test_workers_0_is_refused_by_name(monkeypatch, capsys, tmp_path):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *TINY, "--steps", "1", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers" in err and re.search(r"\b0\b", err), err
    assert not (tmp_path / "runs").exists()


# -- --workers N is bounded by the CPUs, checked before anything starts (nothing is launched here) --
@pytest.fixture
def launcher(monkeypatch, tmp_path):
    """A machine with 2 usable CPUs whose mpiexec is never run: mpi4py "installed", an mpiexec
    file beside Python, and every way of starting a process recorded instead of taken."""
    _alone_with_mpi4py(monkeypatch)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mpiexec").write_text("#!/bin/sh\nexit 99\n")
    (tmp_path / "bin" / "mpiexec").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    started = []

    def record(command, **kwargs):
        started.append((command, kwargs.get("env")))
        return 0

    monkeypatch.setattr(subprocess, "call", record)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"a process was started: {a}"))
    monkeypatch.chdir(tmp_path)
    return started


@pytest.mark.parametrize(
    "flags,fragments,absent",
    [
        (
            ["--workers", "1000"],
            [
                "--workers 1000 would start 1000",
                "the 2 CPUs this process may use",
                "os.sched_getaffinity",
                "give --workers 2 or fewer",
                "mpiexec -n 1000 -f HOSTFILE minitensor train",
            ],
            ["--oversubscribe"],  # 1000 is beyond what --oversubscribe allows too: not offered
        ),
        (
            ["--workers", "3"],
            ["--workers 3 would start 3", f"add --oversubscribe (up to {2 * OVERSUBSCRIBE_FACTOR}"],
            [],
        ),
        (
            ["--workers", str(2 * OVERSUBSCRIBE_FACTOR + 1), "--oversubscribe"],
            [f"at most {2 * OVERSUBSCRIBE_FACTOR} processes here", "mpiexec -n"],
            [],
        ),
        (["--oversubscribe"], ["--oversubscribe", "give it with --workers N"], []),
    ],
    ids=["1000-on-2-cpus", "3-on-2-cpus", "past-the-oversubscribe-cap", "oversubscribe-alone"],
)
def test_workers_beyond_the_cpus_are_one_line_and_start_nothing(launcher, capsys, tmp_path, flags, fragments, absent):
    assert cli.main(["train", *TINY, "--steps", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("minitensor train: error: ") and "Traceback" not in err, err
    assert all(f in err for f in fragments) and not any(a in err for a in absent), err
    assert launcher == [] and not (tmp_path / "runs").exists()


def test_workers_within_the_cpus_or_oversubscribed_start_mpiexec_with_a_share_of_the_threads(launcher, monkeypatch):
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["train", *TINY, "--steps", "1", "--workers", "2"]) == 0
    assert cli.main(["train", *TINY, "--steps", "1", "--workers", "5", "--oversubscribe"]) == 0
    (two, env_two), (five, env_five) = launcher
    assert two[1:3] == ["-n", "2"] and five[1:3] == ["-n", "5"] and two[0].endswith("mpiexec")
    assert env_two["NUMBA_NUM_THREADS"] == env_five["NUMBA_NUM_THREADS"] == "1"  # 2 CPUs // N, at least 1
    assert "--oversubscribe" in five  # each rank gets the same command line (and checks nothing more)


def test_bad_settings_are_one_error_before_mpiexec_starts(launcher, capsys):
    assert cli.main(["train", *TINY, "--steps", "1", "--workers", "2", "--num-hiddens", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--num-hiddens" in err and "rank" not in err, err
    assert launcher == []


def test_usable_cpus_follow_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 7}, raising=False)
    assert distributed.usable_cpus() == 3
    distributed.check_local_workers(3)
    distributed.check_local_workers(3 * OVERSUBSCRIBE_FACTOR, oversubscribe=True)
    with pytest.raises(distributed.DistributedError, match="give --workers 3 or fewer"):
        distributed.check_local_workers(4)
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS, Windows: the machine's count
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert distributed.usable_cpus() == 6


def test_mpiexec_with_another_number_of_workers_is_refused(tmp_path):
    mpiexec = _mpiexec()
    done = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, "-m", "minitensor", "train", *TINY, "--steps", "1", "--workers", "3"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=60,
    )
    assert done.returncode != 0, done.stderr
    errors = [line.split("error: ", 1)[1] for line in done.stderr.splitlines() if "error: " in line]
    assert errors and "Traceback" not in done.stderr, done.stderr
    for error in errors:  # every rank that speaks names both numbers
        assert "--workers 3" in error and re.search(r"\b2\b", error), done.stderr
    assert not (tmp_path / "runs").exists()
