"""Data-parallel training over MPI: 2 processes x 1 thread vs 1 x 2 and 1 x 1, minitensor and PyTorch DDP.

What is measured
----------------
Training steps of ``train_step.py``'s ``large`` Transformer (num_hiddens 256, ffn 1024, 8
heads, 4 + 4 blocks, dropout 0.2; global batch 64 x 64 tokens, random tokens as there) on
two cores, spent three ways:

- ``1 x 1``: one process, one BLAS / numba thread -- the reference;
- ``1 x 2``: one process, two threads (what ``minitensor train`` does with one worker);
- ``2 x 1``: two processes of one thread each, each taking half of every global minibatch
  and all-reducing the gradients (what ``minitensor train --workers 2`` does: it starts
  ``mpiexec -n 2`` with one thread per process).

The step is the one ``minitensor train`` takes: each process builds the model with
``minitensor.train.config.build_model`` (the same seed everywhere, rank 0's weights
broadcast), its optimiser and schedule with ``build_optimizer`` / ``build_scheduler``, and
reads its rows of each global minibatch from ``Batches(shard=(rank, size))``; every timed
step is the next minibatch plus ``minitensor.train.loop.train_step``, the loop's own step
(forward, the loss over valid target tokens, a small Allreduce of the loss, backward,
``allreduce_gradients``, clipping to norm 1, Adam, the schedule). Every setting takes the
same global minibatches in the same order. The processes are launched with ``mpiexec -n 2``
(the one beside Python, as ``--workers`` finds it), a single process plainly, with
``OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS`` set to the setting's thread count (the worker checks
that BLAS, numba and PyTorch took it).

PyTorch, where it is installed: ``train_step.py``'s twin of the model, starting from the
same weights, on the same global minibatches and the same split -- ``1 x 1`` and ``1 x 2``
a plain process, ``2 x 1`` two processes under ``DistributedDataParallel`` over gloo (no
buffer broadcast before each forward: the only buffer is the constant sinusoidal table). Its
loss is scaled so that DDP's average of the ranks' gradients is the gradient of the global
mean over valid tokens, as minitensor's (one small all_reduce of the loss and token count
per step, as minitensor's); then clipping to norm 1 and Adam.

Before timing, the first 2-process launch of each library checks that it computes what one
process does: with dropout off and the same weights, the gradient after the all-reduce of
two ranks' halves of a 16-row batch equals one process's gradient of the whole batch
(minitensor's own, and PyTorch DDP's against minitensor's one-process gradient).

Method: ``ROUNDS`` rounds; each launches every setting once, in alternating order (A B C,
C B A, ...), so that a slow spell of the machine hits all of them; each launch takes
``WARMUP`` untimed steps (numba's kernels load, BLAS spins up, DDP builds its buckets) and
then ``STEPS`` timed ones, each after a garbage collection (and, between processes, a
barrier) outside the timed region. A 2-process step's time is the slower rank's. The table
gives, over all timed steps:

- *step*: the median step time ±IQR/2;
- *tokens/s*: the global minibatch's valid target tokens (the mean over the timed steps)
  per median step, the throughput ``minitensor train`` shows as ``tok_s``;
- *speed-up*: the 1 x 1 step time / this setting's (same library);
- *efficiency*: speed-up / cores used (processes x threads): 100% is perfect scaling;
- *all-reduce in step* (minitensor, 2 x 1): the median time inside ``allreduce_gradients``,
  packing the 4 MiB buckets, MPI_Allreduce, unpacking -- and waiting for the other rank to
  finish its backward, the load imbalance;
- *all-reduce alone*: the same call after the timed steps, each after a barrier, so only
  the communication and copies (PyTorch: ``dist.all_reduce`` of all the gradients as one
  flat tensor; DDP's own all-reduce overlaps with the backward and is not timed apart);
- *others' CPU*: the largest share of one core that other processes took during any launch
  of the setting (the machine's busy time in ``/proc/stat`` less the launch's own CPU time):
  near 0% on a quiet machine; a row where it is high was measured on a shared core.

Targets (minitensor): ``2 x 1`` gives >= 1.7x the throughput of ``1 x 1`` and is no slower
than ``1 x 2``. PyTorch's rows are for comparison.

Read the figures only from an idle machine: with two processes on two cores, a third
process steals a core from a rank, and the other rank waits for it at every all-reduce.

``--quick``: a tiny model (32 hiddens, 1 + 1 blocks, batch 16 x 16 tokens), one round of 3
steps: a smoke run of a few seconds; the targets are judged on the full run.

    python bench/data_parallel.py [--quick] [--rounds R] [--steps K] [--warmup W] [--no-torch]
"""

import argparse
import gc
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
from _common import (
    Stats,
    format_stats,
    format_time,
    import_torch,
    print_header,
    print_table,
    thread_env,
    verdict,
)

SPEEDUP_TARGET = 1.7  # minitensor 2 x 1 throughput / 1 x 1
SETTINGS = ((1, 1), (1, 2), (2, 1))  # (processes, threads per process)
ROUNDS, WARMUP, STEPS = 3, 2, 4
QUICK_ROUNDS, QUICK_WARMUP, QUICK_STEPS = 1, 1, 3
ALONE_REPEATS = 10  # all-reduces timed on their own, after the steps
CHECK_ROWS = 16  # the global batch of the agreement check
CHECK_TOLERANCE = 1e-4  # relative: the loss, and each parameter's gradient (Frobenius norms)
SEED = 0
WORKER_TIMEOUT = 1800  # seconds, one launch


def bench_config(quick):
    """``train_step.py``'s large configuration (or a tiny one for ``--quick``)."""
    import train_step as ts

    if quick:
        return replace(
            ts.CONFIGS["large"],
            name="quick",
            num_hiddens=32,
            ffn_num_hiddens=64,
            num_heads=4,
            num_blks=1,
            batch_size=16,
            num_steps=16,
        )
    return ts.CONFIGS["large"]


def train_config(cfg):
    """The TrainConfig ``minitensor train`` would run ``cfg`` with: post-LN blocks as the
    PyTorch twin's, Adam at train_step's learning rate, the default clipping and schedule."""
    import train_step as ts

    from minitensor.train.config import TrainConfig

    return TrainConfig(
        num_hiddens=cfg.num_hiddens,
        ffn_num_hiddens=cfg.ffn_num_hiddens,
        num_heads=cfg.num_heads,
        num_blks=cfg.num_blks,
        dropout=cfg.dropout,
        norm_first=False,
        batch_size=cfg.batch_size,
        lr=ts.LR,
        seed=SEED,
    )


def data_arrays(cfg):
    """``train_step``'s random batches as the five arrays of the loop's seq2seq data:
    (enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y), ``NUM_BATCHES`` global batches long."""
    import train_step as ts

    batches = ts.make_batches(cfg, seed=SEED)
    cat = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    dec_valid_lens = cat["mask"].sum(axis=1)
    return cat["enc_X"], cat["enc_valid_lens"], cat["dec_X"], dec_valid_lens, cat["Y"]


def check_arrays(cfg):
    """The agreement check's batch: CHECK_ROWS rows of the same shapes, other random tokens."""
    import train_step as ts

    (b,) = ts.make_batches(replace(cfg, batch_size=CHECK_ROWS), n=1, seed=123)
    return b["enc_X"], b["enc_valid_lens"], b["dec_X"], b["mask"].sum(axis=1), b["Y"]


def relative_difference(ours, theirs):
    """(name, largest |a - b| / |b| over the parameters, Frobenius norms)."""
    return max(
        ((n, float(np.linalg.norm(ours[n] - theirs[n]) / (np.linalg.norm(theirs[n]) + 1e-30))) for n in ours),
        key=lambda pair: pair[1],
    )


def thread_counts(torch=None):
    """The thread counts this process really has: BLAS (threadpoolctl), numba, PyTorch."""
    from threadpoolctl import threadpool_info

    counts = {"blas": max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=None)}
    numba = sys.modules.get("numba")
    if numba is not None:
        counts["numba"] = numba.get_num_threads()
    if torch is not None:
        counts["torch"] = torch.get_num_threads()
    return counts


def forever(loader):
    while True:
        yield from loader


# -- the minitensor worker: one process of a launch --------------------------------------------------
def minitensor_worker(cfg, warmup, steps, check):
    """Train as ``minitensor train`` does, time the steps; rank 0 prints a JSON line."""
    import train_step as ts
    from minitensor.random import manual_seed

    import minitensor.train.loop as loop
    from minitensor.data import Batches
    from minitensor.train.config import build_model, build_optimizer, build_scheduler
    from minitensor.train.distributed import allreduce_gradients, broadcast_parameters, rank_seed, world

    config = train_config(cfg)
    ranks = world()
    manual_seed(config.seed)
    # build_model reads only len() of the vocabularies: train_step's vocabulary sizes
    model = build_model(config, range(ts.SRC_VOCAB), range(ts.TGT_VOCAB))
    optimizer = build_optimizer(config, model)
    scheduler = build_scheduler(config, optimizer, warmup + steps)
    loader = Batches(
        *data_arrays(cfg),
        batch_size=config.batch_size,
        shuffle=True,
        rng=np.random.default_rng(config.seed),
        shard=(ranks.rank, ranks.size),
    )
    if ranks.size > 1:  # as the loop's set_up
        broadcast_parameters(model.parameters(), ranks)
        if ranks.rank > 0:
            manual_seed(rank_seed(config.seed, ranks.rank, 0))
    data = SimpleNamespace(tgt_vocab=SimpleNamespace(pad=ts.PAD, token_to_idx={"<pad>": ts.PAD}))

    result = {}
    if check and ranks.size > 1:
        result["check"] = minitensor_check(cfg, config, model, ranks, data, loop, allreduce_gradients)

    # the loop's step, its gradient all-reduce timed on the way (the loop calls it by this name)
    in_step = []

    def timed_allreduce(*args, **kwargs):
        start = time.perf_counter()
        try:
            return allreduce_gradients(*args, **kwargs)
        finally:
            in_step.append(time.perf_counter() - start)

    loop.allreduce_gradients = timed_allreduce
    state = SimpleNamespace(
        config=config,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
        data=data,
        world=ranks,
        step=0,
        history={"loss": []},
        tokens_seen=0,
        bar=None,
        read_every=1,  # the losses read at every step, as the loop does on the CPU
        unread=[],
        graphed=None,  # no CUDA graphs (--cuda-graph): the CPU launches no kernels
    )
    batches = forever(loader)
    times, tokens = [], []
    gc.collect()
    gc.freeze()
    for i in range(warmup + steps):
        gc.collect()
        ranks.barrier()
        gc.disable()
        seen = state.tokens_seen
        start = time.perf_counter()
        loop.train_step(state, next(batches))
        elapsed = time.perf_counter() - start
        gc.enable()
        if i >= warmup:
            times.append(elapsed)
            tokens.append(state.tokens_seen - seen)
    loop.allreduce_gradients = allreduce_gradients

    if ranks.size > 1:
        # every rank's step times, the step's time being the slower rank's
        slots = np.zeros((ranks.size, steps))
        slots[ranks.rank] = times
        times = ranks.sum(slots.ravel()).reshape(ranks.size, steps).max(axis=0).tolist()
        alone = []
        for _ in range(ALONE_REPEATS):
            ranks.barrier()
            start = time.perf_counter()
            allreduce_gradients(model.parameters(), 1, ranks)
            alone.append(time.perf_counter() - start)
        result["allreduce_in_step"] = in_step[warmup:]
        result["allreduce_alone"] = alone
    if ranks.is_main:
        result.update(times=times, tokens=tokens, processes=ranks.size, threads=thread_counts())
        print(json.dumps(result))


def minitensor_check(cfg, config, model, ranks, data, loop, allreduce_gradients):
    """No dropout, the same weights: the all-reduced gradient of the ranks' halves of a batch
    vs one process's gradient of the whole batch (rank 0 computes both)."""
    from minitensor import tensor
    from minitensor.data.batching import shard_bounds

    arrays = check_arrays(cfg)
    model.eval()
    start, stop = shard_bounds(CHECK_ROWS, ranks.rank, ranks.size)
    for p in model.parameters():
        p.grad = None
    loss, n = loop._loss(model, [tensor(a[start:stop]) for a in arrays], config, data.tgt_vocab.pad)
    n = int(n)  # the token count, a 0-d Tensor (training keeps it on the device)
    total_loss, _ = ranks.sum([loss.item() * n, n])
    loss.backward()
    total = allreduce_gradients(model.parameters(), n, ranks)
    reduced = {name: p.grad.numpy().copy() for name, p in model.named_parameters()}
    out = None
    if ranks.is_main:
        for p in model.parameters():
            p.grad = None
        whole, _ = loop._loss(model, [tensor(a) for a in arrays], config, data.tgt_vocab.pad)
        whole.backward()
        single = {name: p.grad.numpy() for name, p in model.named_parameters()}
        name, worst = relative_difference(reduced, single)
        loss_diff = abs(total_loss / total - whole.item()) / abs(whole.item())
        out = {"loss_diff": loss_diff, "grad_diff": worst, "grad_name": name}
    ranks.barrier()
    for p in model.parameters():
        p.grad = None
    model.train()
    return out


# -- the PyTorch worker -------------------------------------------------------------------------------
def torch_worker(cfg, warmup, steps, check):
    """The twin on the same global minibatches and split; DDP (gloo) when WORLD_SIZE > 1."""
    import torch
    import torch.distributed as dist
    import train_step as ts

    from minitensor.data.batching import shard_bounds

    rank, size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if size > 1:
        dist.init_process_group("gloo", rank=rank, world_size=size)
    # the weights minitensor starts from (build_model, the same seed), copied into the twin
    from minitensor.random import manual_seed

    import minitensor.train.config as mtc

    config = train_config(cfg)
    manual_seed(config.seed)
    mt_model = mtc.build_model(config, range(ts.SRC_VOCAB), range(ts.TGT_VOCAB))
    twin, optimizer = ts.build_torch(torch, cfg, state=ts.minitensor_state(mt_model), seed=SEED + rank)
    model = twin
    if size > 1:  # DDP broadcasts rank 0's weights at the start: identical replicas
        DDP = torch.nn.parallel.DistributedDataParallel
        # no buffer broadcast before every forward: the only buffer is a constant table
        # (newer PyTorch names the setting forward_sync_buffers)
        quiet = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else None
        model = DDP(twin, **({quiet: False} if quiet else {"broadcast_buffers": False}))

    def local_loss(arrays):
        """(the sum of the local tokens' losses, their number), ``arrays`` this rank's rows."""
        enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y = (torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)
        logits = model(enc_X, dec_X, enc_valid_lens)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), Y.reshape(-1), ignore_index=ts.PAD, reduction="sum"
        )
        return loss, int(dec_valid_lens.sum())

    def global_scaled(loss_sum, n):
        """The loss whose gradient, averaged over the ranks by DDP, is the global mean's."""
        if size == 1:
            return loss_sum / n, loss_sum.item() / n, n
        totals = torch.tensor([loss_sum.item(), float(n)], dtype=torch.float64)
        dist.all_reduce(totals)
        N = float(totals[1])
        return loss_sum * (size / N), float(totals[0]) / N, int(N)

    result = {}
    if check and size > 1:
        arrays = check_arrays(cfg)
        start, stop = shard_bounds(CHECK_ROWS, rank, size)
        model.eval()
        loss, value, _ = global_scaled(*local_loss([a[start:stop] for a in arrays]))
        loss.backward()
        if rank == 0:
            import minitensor as mt

            mt_model.eval()
            import minitensor.train.loop as loop

            # minitensor, one process, the whole batch
            mt_loss, _ = loop._loss(mt_model, [mt.tensor(a) for a in arrays], config, ts.PAD)
            mt_loss.backward()
            ours = ts.as_torch_names(ts.minitensor_grads(mt_model))
            name, worst = relative_difference({k: v for k, v in ts.torch_grads(twin).items() if k in ours}, ours)
            loss_diff = abs(value - mt_loss.item()) / abs(mt_loss.item())
            result["check"] = {"loss_diff": loss_diff, "grad_diff": worst, "grad_name": name}
        optimizer.zero_grad()
        model.train()
        dist.barrier()

    rows = data_arrays(cfg)
    # the global minibatches of minitensor's Batches (the same seed): the same order
    from minitensor.data import Batches

    order = Batches(*rows, batch_size=cfg.batch_size, rng=np.random.default_rng(SEED))
    times, tokens, alone = [], [], []
    gc.collect()
    gc.freeze()
    for i in range(warmup + steps):
        epoch, position = divmod(i, len(order))
        idx = order.order(epoch)[position * cfg.batch_size : (position + 1) * cfg.batch_size]
        start_row, stop_row = shard_bounds(len(idx), rank, size)
        gc.collect()
        if size > 1:
            dist.barrier()
        gc.disable()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss, _, N = global_scaled(*local_loss([a[idx[start_row:stop_row]] for a in rows]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        elapsed = time.perf_counter() - start
        gc.enable()
        if i >= warmup:
            times.append(elapsed)
            tokens.append(N)
    if size > 1:
        everyone = torch.zeros(size, steps, dtype=torch.float64)
        everyone[rank] = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(everyone)
        times = everyone.max(dim=0).values.tolist()
        flat = torch.cat([p.grad.reshape(-1) for p in twin.parameters()])
        for _ in range(ALONE_REPEATS):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(flat)
            alone.append(time.perf_counter() - start)
        result["allreduce_alone"] = alone
    if rank == 0:
        result.update(times=times, tokens=tokens, processes=size, threads=thread_counts(torch))
        print(json.dumps(result))
    if size > 1:
        # Leave without tearing gloo down: at interpreter exit its threads sometimes end the
        # process with "terminate called without an active exception" (SIGABRT) after the
        # work is done. Every rank is past the last collective once the barrier returns.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# -- the driver ---------------------------------------------------------------------------------------
def find_mpiexec():
    """mpiexec beside this Python (the MPICH wheel's) or on PATH, as ``minitensor train --workers``."""
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return shutil.which("mpiexec", path=search)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(framework, processes, threads, args, check, mpiexec):
    """One launch of a setting; the JSON its rank 0 printed."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", framework, "--warmup", str(args.warmup)]
    command += ["--steps", str(args.steps)] + (["--quick"] if args.quick else []) + (["--check"] if check else [])
    env = thread_env(threads)
    if framework == "minitensor" and processes > 1:
        procs = [subprocess.Popen([mpiexec, "-n", str(processes), *command], env=env, **_pipes())]
    elif processes > 1:  # PyTorch: its own launcher's environment (torchrun's), one process per rank
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(processes))
        procs = [subprocess.Popen(command, env={**env, "RANK": str(r)}, **_pipes()) for r in range(processes)]
    else:
        procs = [subprocess.Popen(command, env=env, **_pipes())]
    outputs, cpu = [], machine_cpu()
    try:
        for proc in procs:
            outputs.append((proc, *proc.communicate(timeout=WORKER_TIMEOUT)))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, _, stderr in outputs:
        if proc.returncode != 0:
            raise RuntimeError(f"{framework} {processes} x {threads} failed ({proc.returncode}):\n{stderr[-4000:]}")
    result = json.loads(outputs[0][1].strip().splitlines()[-1])
    result["others_cpu"] = others_cpu(cpu)
    wrong = {k: v for k, v in result["threads"].items() if v is not None and v != threads}
    if wrong:
        raise RuntimeError(f"{framework} {processes} x {threads}: the worker runs with other thread counts: {wrong}")
    return result


def machine_cpu():
    """(CPU seconds the whole machine was busy, CPU seconds of this process's waited-for
    children, wall time); the busy part None where there is no ``/proc/stat``."""
    import resource

    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
        busy = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = None
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, children.ru_utime + children.ru_stime, time.perf_counter()


def others_cpu(before):
    """The share of one core that processes other than the launch's used since ``before``
    (``machine_cpu()``): what a quiet machine keeps near 0%."""
    after = machine_cpu()
    if before[0] is None or after[0] is None:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / (after[2] - before[2])


def _pipes():
    return {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, one round of 3 steps (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help=f"launches of every setting (default {ROUNDS})")
    parser.add_argument("--steps", type=int, default=None, help=f"timed steps per launch (default {STEPS})")
    parser.add_argument("--warmup", type=int, default=None, help=f"untimed steps first (default {WARMUP})")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    parser.add_argument("--worker", choices=("minitensor", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    args.steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    args.warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else WARMUP)
    cfg = bench_config(args.quick)
    if args.worker:
        worker = minitensor_worker if args.worker == "minitensor" else torch_worker
        return worker(cfg, args.warmup, args.steps, args.check)

    print_header(
        "Data-parallel training: 2 processes x 1 thread vs 1 x 2 and 1 x 1, minitensor and PyTorch", args.quick
    )
    mpiexec = find_mpiexec()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        raise SystemExit('mpi4py and mpiexec are needed (the dist extra: pip install -e ".[dist]")')
    torch = None if args.no_torch else import_torch()
    if torch is None and not args.no_torch:
        print("PyTorch is not installed: its rows (DDP over gloo) are left out")
    if os.getloadavg()[0] >= 0.5:
        print(
            "note: other processes are running (load average >= 0.5): a busy core slows one rank, and the "
            "other waits for it at every all-reduce"
        )
    print(
        f"[{cfg.name}] {cfg.describe()}; {args.rounds} round(s) of every setting, each {args.steps} timed steps "
        f"after {args.warmup} warm-up; mpiexec {mpiexec}"
    )
    frameworks = ["minitensor"] + (["torch"] if torch is not None else [])
    cases = [(f, p, t) for f in frameworks for p, t in SETTINGS]
    results = {}
    for r in range(args.rounds):
        for case in cases if r % 2 == 0 else reversed(cases):
            framework, processes, threads = case
            out = launch(framework, processes, threads, args, check=(r == 0 and processes > 1), mpiexec=mpiexec)
            if "check" in out:
                report_check(framework, out["check"])
            merged = results.setdefault(case, {})
            for key in ("times", "tokens", "allreduce_in_step", "allreduce_alone"):
                merged.setdefault(key, []).extend(out.get(key, []))
            if out["others_cpu"] is not None:
                merged.setdefault("others_cpu", []).append(out["others_cpu"])
    rows, stats = table(cases, results, cfg)
    print_table(
        [
            "library",
            "processes x threads",
            "step",
            "tokens/s",
            "speed-up",
            "efficiency",
            "vs torch",
            "all-reduce in step",
            "all-reduce alone",
            "others' CPU",
        ],
        rows,
        title=f"Median time per training step (±IQR/2), global batch {cfg.batch_size} x {cfg.num_steps} tokens, "
        f"{args.rounds * args.steps} steps per setting",
    )
    busy = [x for res in results.values() for x in res.get("others_cpu", [])]
    if busy and max(busy) > 0.1:
        print(
            f"note: other processes took up to {max(busy):.0%} of a core during a launch: the rows where "
            "'others' CPU' is high are slowed by them"
        )
    print_verdicts(stats, args.quick)


def report_check(framework, check):
    ok = check["loss_diff"] <= CHECK_TOLERANCE and check["grad_diff"] <= CHECK_TOLERANCE
    what = (
        "minitensor, 2 processes' all-reduced gradient vs 1 process's"
        if framework == "minitensor"
        else "PyTorch DDP (2 processes) vs minitensor (1 process)"
    )
    print(
        f"[check] {what}, {CHECK_ROWS} rows, same weights, no dropout: loss rel. diff {check['loss_diff']:.1e}, "
        f"gradients' largest |a - b| / |b| {check['grad_diff']:.1e} ({check['grad_name']}): "
        f"{'agree' if ok else 'DISAGREE'}"
    )
    if not ok:
        raise SystemExit(f"{framework}: the data-parallel step does not compute what one process does")


def table(cases, results, cfg):
    stats, rows = {}, []
    for case in cases:
        framework, processes, threads = case
        res = results[case]
        stats[case] = Stats.of(res["times"])
    for case in cases:
        framework, processes, threads = case
        res, step = results[case], stats[case]
        speedup = stats[(framework, 1, 1)].median / step.median
        tokens = float(np.mean(res["tokens"])) / step.median
        peer = stats.get(("torch", processes, threads)) if framework == "minitensor" else None
        in_step = Stats.of(res["allreduce_in_step"]) if res.get("allreduce_in_step") else None
        alone = Stats.of(res["allreduce_alone"]) if res.get("allreduce_alone") else None
        rows.append(
            [
                framework,
                f"{processes} x {threads}",
                format_stats(step),
                f"{tokens:,.0f}",
                f"{speedup:.2f}x",
                f"{speedup / (processes * threads):.0%}",
                f"{step.median / peer.median:.2f}x" if peer else "-",
                format_stats(in_step) if in_step else "-",
                format_stats(alone) if alone else "-",
                f"{max(res['others_cpu']):.0%}" if res.get("others_cpu") else "-",
            ]
        )
    return rows, stats


def print_verdicts(stats, quick):
    one, threads2, procs2 = (stats[("minitensor", p, t)].median for p, t in SETTINGS)
    if quick:
        print("--quick: the targets are judged on the full run (the large model)")
        return
    speedup = one / procs2
    print(
        f"{verdict(speedup >= SPEEDUP_TARGET)}  minitensor 2 x 1: {speedup:.2f}x the throughput of 1 x 1 "
        f"(target >= {SPEEDUP_TARGET}x; efficiency {speedup / 2:.0%})"
    )
    print(
        f"{verdict(procs2 <= threads2)}  minitensor 2 x 1: a step takes {format_time(procs2)} against "
        f"{format_time(threads2)} at 1 x 2 ({procs2 / threads2:.2f}x; target: no slower, <= 1.00x)"
    )


if __name__ == "__main__":
    main()
