"""The training loop: data, model, optimiser, schedule, evaluation, checkpoints, pictures.

    from minitensor.train import TrainConfig, train
    result = train(TrainConfig(task="date", epochs=4, out="runs/date"))
    result.accuracy, result.checkpoint, result.figures

One step (teacher forcing, D2L 10.7): the decoder reads the target shifted right by <bos>
and predicts the target itself; the loss is the cross-entropy over the valid (non-padding)
target positions, optionally label-smoothed; gradients are clipped to a total norm, then
Adam(W) steps and the schedule sets the next learning rate (warm-up, then cosine decay).

After every epoch: the held-out loss, the exact-match accuracy of greedy decoding on the
held-out set (batched), the latest checkpoint in the run folder's checkpoint/ and, when the
held-out loss is the lowest so far, the weights in its best/ (see ``run.py``).
``train(config, resume=True)`` continues from that checkpoint exactly as the uninterrupted run
would have gone on: the same data (rebuilt from the seed), weights, optimiser moments,
schedule, position in the epoch's shuffled order and random generators (dropout), so the
losses match bit for bit.

A loss that becomes NaN or inf stops the run with a ``TrainingError`` naming the step:
continuing would only turn every weight into NaN. On the CPU the step's loss and gradient
norm are read at once, so the run stops before the weights change. On a device (a GPU) a
step never waits for the device: reading a number would make the host wait for the step's
own work, and the GPU would idle while the host prepares the next. So the numbers stay on
the device and are read together every ``READ_EVERY`` steps, at the end of an epoch and of
the run (``read_losses``); a diverged step is found there, at most ``READ_EVERY - 1`` steps
later, named, and stops the run before any checkpoint is written.

Reading order: ``train`` is the loop, one comment per phase; the phases follow it, in the
order they run: ``set_up`` (fresh, or from the checkpoint), ``train_step`` (one minibatch),
``end_of_epoch`` (evaluate, log, ``save_checkpoints``) and ``finish`` (the final report).
What they share is a ``TrainState``.
"""

import contextlib
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy

from .. import Tensor, autocast, tensor
from ..backends import get_backend
from ..data import Batches, build_array, lm_arrays, seq2seq_arrays, unigram_baseline
from ..grad_mode import no_grad
from ..i18n import drawn_lang, label
from ..inference import SAMPLE_TEMPERATURE, generate, translate
from ..metrics import bleu, corpus_bleu, exact_match
from ..nn.attention import plain_attention
from ..ops.join import stack
from ..ops.loss import cross_entropy
from ..optim import WarmupCosineLR, clip_grad_norm_
from ..precision import set_float32_matmul_precision
from ..random import manual_seed
from .checkpoint import load_checkpoint, save_checkpoint
from .config import (
    TOKENIZER_FILE,
    TrainConfig,
    build_data,
    build_model,
    build_optimizer,
    build_scheduler,
    check_fits_device,
    cosine_end,
    detokenize,
    load_tokenizer,
    loss_per_char,
    model_scorer,
)
from .distributed import allreduce_gradients, broadcast_parameters, rank_seed, select_gpu, world
from .graphed import GraphedStep
from .plots import plot_loss, plot_seq2seq_attention, plot_transformer_attention
from .run import BEST_DIR, RunFolder, load_run_checkpoint


class TrainingError(RuntimeError):
    """Training cannot go on: the loss diverged, or a checkpoint does not fit the run."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``train``: raised at the end of the step in progress, once the checkpoint
    being written (if any) is complete.
    ``str()`` says where the run stopped and how to continue it."""


@dataclass
class TrainResult:
    """What ``train`` returns."""

    model: object
    config: TrainConfig
    src_vocab: object
    tgt_vocab: object
    history: dict
    step: int
    epoch: int
    accuracy: float | None = None  # held-out exact match (seq2seq)
    heldout_loss: float | None = None
    bleu: float | None = None  # held-out corpus BLEU (seq2seq)
    samples: list = field(default_factory=list)  # (source, prediction, reference, BLEU) / generated text
    checkpoint: str | None = None
    figures: list = field(default_factory=list)
    wall_time: float = 0.0
    finished: bool = True  # False when stopped early by ``stop_after_epochs``


#: the most rows ``estimate_losses`` gathers at once (whole evaluation batches): its --eval-iters
#: x --batch-size rows are evaluated in chunks of about this many, never copied all at once
ESTIMATE_CHUNK_ROWS = 8192

#: how often a run on a device reads its losses (and the progress bar shows them): every
#: READ_EVERY steps. On the CPU they are read at every step, where reading is free.
READ_EVERY = 10


# -- the loss of a minibatch, and the arrays it comes from ---------------------------------------
def _pad(vocab):
    """The index the loss ignores: <pad>'s, or -100 (no index) for a vocabulary without one."""
    return vocab.token_to_idx.get("<pad>", -100)


def _loss(model, batch, config, pad):
    """(loss, number of target tokens) of one minibatch; the number is an int, or a 0-d Tensor
    on the batch's device (``dec_valid_lens.sum()``: read, it would make the step wait). In
    ``mt.autocast`` with ``--autocast``; backward runs outside, as PyTorch advises."""
    with mixed_precision(config):
        if config.model == "lm":
            X, Y = batch
            return cross_entropy(model(X), Y, label_smoothing=config.label_smoothing), Y.numel()
        enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y = batch
        logits = model(enc_X, dec_X, enc_valid_lens)
        # The valid positions of Y never hold <pad> (it is no token of the data), so ignoring
        # <pad> is D2L's mask by dec_valid_lens.
        loss = cross_entropy(logits, Y, ignore_index=pad, label_smoothing=config.label_smoothing)
        return loss, dec_valid_lens.sum()


def mixed_precision(config):
    """``mt.autocast`` for the run's device where ``--autocast`` asks for it (bfloat16 products,
    float32 softmaxes, norms and losses, float32 weights), else a block that changes nothing."""
    return autocast(config.device.split(":")[0], enabled=config.autocast)


def _arrays(config, data, which):
    if config.model == "lm":
        corpus = data.train if which == "train" else data.heldout
        X, Y = lm_arrays(corpus, data.num_steps)
        stride = data.num_steps  # non-overlapping windows, as D2L's sequential partitioning
        return numpy.ascontiguousarray(X[::stride]), numpy.ascontiguousarray(Y[::stride])
    pairs = data.train if which == "train" else data.heldout
    return seq2seq_arrays(pairs, data.src_vocab, data.tgt_vocab, data.num_steps, data.tgt_num_steps)


# -- evaluation -----------------------------------------------------------------------------------
def heldout_loss(model, arrays, config, pad):
    """Mean token loss over the held-out arrays (no dropout, no graph, no label smoothing)."""
    total, count = summed_loss(model, arrays, config, pad)
    return total / max(count, 1)


def summed_loss(model, arrays, config, pad):
    """(summed token loss, number of tokens) over ``arrays``, as ``heldout_loss`` scores them.

    On a device the batches' losses stay there and are read once, summed in float64, at the
    end: a read per batch would make the host wait for each forward before it queued the next.
    The token counts come from the host's arrays, which are there already."""
    was_training = model.training
    model.eval()
    total, count, losses = 0.0, 0, []
    n, size = len(arrays[0]), config.eval_batch_size
    on_host = get_backend(config.device).on_host
    try:
        with no_grad(), mixed_precision(config):  # scored as the run trains
            for i in range(0, n, size):
                batch = [tensor(a[i : i + size], device=config.device) for a in arrays]
                if config.model == "lm":
                    X, Y = batch
                    loss, tokens = cross_entropy(model(X), Y, reduction="sum"), Y.numel()
                else:
                    enc_X, enc_valid_lens, dec_X, _, Y = batch
                    loss = cross_entropy(model(enc_X, dec_X, enc_valid_lens), Y, ignore_index=pad, reduction="sum")
                    tokens = int(numpy.sum(arrays[3][i : i + size]))  # dec_valid_lens, on the host
                if on_host:
                    total += loss.item()
                else:
                    losses.append(loss.double())
                count += tokens
            if losses:
                total = stack(losses).sum().item()
    finally:
        model.train(was_training)
    return total, count


def decode_heldout(model, pairs, data, config, beam_size=1):
    """Greedy (or beam) translations of every held-out source, in batches: token lists."""
    preds = []
    for i in range(0, len(pairs), config.eval_batch_size):
        chunk = [s for s, _ in pairs[i : i + config.eval_batch_size]]
        hyps = translate(
            model,
            chunk,
            data.src_vocab,
            data.tgt_vocab,
            data.num_steps,
            beam_size=beam_size,
            max_len=data.tgt_num_steps,
        )
        preds.extend(h.tokens for h in hyps)
    return preds


def evaluate(model, data, heldout_arrays, config):
    """{"loss": held-out loss, "exact_match", "bleu"} (seq2seq) or {"loss", "perplexity",
    "loss_per_char"} (LM: the loss in nats per token, and per character of the held-out text)."""
    loss = heldout_loss(model, heldout_arrays, config, _pad(data.tgt_vocab))
    if config.model == "lm":
        per_char = loss_per_char(loss, len(data.heldout), data.heldout_chars or len(data.heldout))
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "loss_per_char": per_char}
    preds = decode_heldout(model, data.heldout, data, config)
    labels = [t for _, t in data.heldout]
    return {"loss": loss, "exact_match": exact_match(preds, labels), "bleu": corpus_bleu(preds, labels)}


# -- helpers --------------------------------------------------------------------------------------
def _progress_bar(config, total, initial):
    """A tqdm bar on a terminal (tqdm imported only now), else None."""
    if not config.progress or not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm  # lazily: only a run on a terminal draws a bar (and tqdm is optional)
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, leave=False, file=sys.stderr)


def _plugins(config):
    """'scorer scaled_dot, pooling softmax, positional sinusoidal': the plugins the model uses, as
    the run's header and its errors name them. The Bahdanau model (a GRU) has no positional
    encoding: naming config.positional would claim one."""
    positional = "" if config.model == "bahdanau" else f", positional {config.positional}"
    return f"scorer {model_scorer(config)}, pooling {config.pooling}{positional}"


def _diverged(what, value, step, epoch, config):
    if step == 1:  # computed before any update: the model itself gives it, whatever the learning rate
        return TrainingError(
            f"the training {what} is {value} at step 1, before any update: the model's output is already "
            f"{value} before training changed anything, so the learning rate is not the cause. Check the "
            f"attention plugins in use ({_plugins(config)}) and their options."
        )
    return TrainingError(
        f"the training {what} became {value} at step {step} (epoch {epoch + 1}): training diverged and was stopped. "
        f"Try a lower learning rate, e.g. --lr {config.lr / 10:g} (now {config.lr:g})"
        + ("" if config.clip_grad_norm else ", or clip the gradients")
        + "."
    )


def _check_resumable(saved, config):
    """TrainingError naming every field that differs between the saved run and ``config``,
    except those a resumed run may change (``TrainConfig.resumable_fields()``) and ``out``
    (where the run lives now)."""
    free = set(TrainConfig.resumable_fields()) | {"out"}
    changed = [
        f"{k}: {saved.setting(k)!r} -> {config.setting(k)!r}"
        for k in config.to_dict()
        if k not in free and saved.setting(k) != config.setting(k)
    ]
    if changed:
        raise TrainingError(
            "cannot resume: the checkpoint was trained with a different configuration ("
            + "; ".join(changed)
            + "); resume with the same settings, or start afresh in a new --out"
        )


def _epochs_done(loader):
    return loader.epoch + (1 if loader.position >= len(loader) else 0)


def _interrupted_message(run, step, saved_step):
    if saved_step is None:
        return f"interrupted at step {step}, before the first checkpoint: nothing was saved in {run.display}"
    return (
        f"interrupted at step {step}; the checkpoint of step {saved_step} is safe in {run.display}: continue "
        f"with {run.command('--resume')}"
    )


@contextlib.contextmanager
def _held_ctrl_c(second_raises):
    """Note Ctrl-C instead of raising it where the main thread happens to be; yields ``check()``,
    which raises the KeyboardInterrupt of a Ctrl-C noted so far. With ``second_raises``, a
    second Ctrl-C raises at once, as Ctrl-C always does. (Signals reach the main thread only:
    elsewhere nothing is held and ``check()`` does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    pressed = []

    def note(signum, frame):
        if pressed and second_raises:
            raise KeyboardInterrupt
        pressed.append(True)

    def check():
        if pressed:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _complete_before_interrupt():
    """Hold back Ctrl-C while a checkpoint is written: it is raised as soon as the save is
    complete, so an interrupted run always keeps its newest checkpoint."""
    with _held_ctrl_c(second_raises=False) as interrupted:
        yield
    interrupted()


def _interrupt_between_steps():
    """Ctrl-C ends the run between two steps, never inside one; yields ``check()``, which raises
    the KeyboardInterrupt of a Ctrl-C pressed since.

    Python raises KeyboardInterrupt wherever the main thread happens to be, and inside a step
    that may be compiled code that cannot pass it on: a Ctrl-C that lands while numba loads or
    compiles a kernel is swallowed by llvmlite's callbacks ("Exception ignored") and the run goes
    on, or is reported and the process still ends by SIGINT instead of with its status. So the
    first Ctrl-C is noted and raised by the loop at the end of the step in progress; a second one
    raises at once, as Ctrl-C always does."""
    return _held_ctrl_c(second_raises=True)


# -- the loop -------------------------------------------------------------------------------------
def train(config=None, log=print, *, resume=False, overwrite=False, stop_after_epochs=None, figures=True, lang="en"):
    """Train the model ``config`` describes (default: ``TrainConfig()``); returns a ``TrainResult``.

    The run lives in the folder ``config.out`` (see ``train.run``): a new run refuses a folder
    that holds one, unless ``overwrite`` (which deletes that run's files first); one process
    at a time. ``log``: where the messages go (one string per call). ``resume``: continue from
    the checkpoint in ``config.out`` (exactly, see the module docstring); only the fields
    ``TrainConfig.resumable_fields()`` names may differ from the saved config -- more
    ``epochs`` or ``steps`` extend the run (a cosine schedule is stretched to the new end).
    ``stop_after_epochs``: stop after this many epochs *of this call*, as an interruption
    would (checkpoint written, no final report); ``result.finished`` is then False.
    ``figures=False``: no loss curve or attention heatmaps at the end (a script training many
    throw-away runs); ``lang``: "en" or "zh", the language of their labels (``minitensor.i18n``).

    After every epoch, ``out/checkpoint`` holds the latest state (for ``resume``) and
    ``out/best`` the weights with the lowest held-out loss so far (what ``translate`` and
    ``generate`` load from a run folder).

    Raises ``TrainingError`` when the loss (or the gradient norm) becomes NaN or inf,
    ``RunFolderError`` for an unusable or occupied folder, ``TrainingInterrupted`` (a
    KeyboardInterrupt) on Ctrl-C, at the end of the step in progress and once the checkpoint is safe.
    """
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(
            f"train: config must be a TrainConfig, got {type(config).__name__}"
            + (" (TrainConfig(**settings) makes one from a dict)" if isinstance(config, dict) else "")
        )
    config = (config or TrainConfig()).validate()
    # data parallelism: this process's place among the N that an MPI launcher started (one: alone);
    # the run records how many trained it this time (a resumed run may use another number)
    ranks = world()
    config = config.replace(workers=ranks.size)
    if ranks.size > 1 and config.device == "cuda":
        select_gpu(ranks)  # one GPU per rank; the gradients meet in host buffers (any MPI will do)
    if not ranks.is_main:
        log = _silent  # rank 0 alone speaks and writes; the others train
    run = RunFolder(config.out, resume=resume, overwrite=overwrite)
    with run if ranks.is_main else contextlib.nullcontext(run):
        # set up: the data, model, optimiser and schedule, made afresh or as the checkpoint left them
        state = set_up(config, run, log, resume, ranks)
        epochs_this_call = 0
        try:
            with _interrupt_between_steps() as interrupted:
                while state.step < state.total_steps:
                    state.model.train()
                    for batch in state.loader:  # this epoch's minibatches (after a resume: the rest of them)
                        # one step: forward, loss, backward, clip, update (stopped if the loss diverged)
                        train_step(state, batch)
                        if config.eval_interval and state.step % config.eval_interval == 0 and ranks.is_main:
                            estimate_losses(state)
                        interrupted()  # a Ctrl-C during the step takes effect here
                        if state.step >= state.total_steps:
                            break
                    # the end of an epoch, or of the run in the middle of one: evaluate, log, checkpoint
                    if ranks.is_main:
                        end_of_epoch(state)
                    interrupted()
                    epochs_this_call += 1
                    stop = stop_after_epochs is not None and epochs_this_call >= stop_after_epochs
                    if stop and state.step < state.total_steps:
                        # as an interruption would: the checkpoint is written, no final report
                        return state.result(finished=False, wall_time=time.perf_counter() - state.start_time)
        except KeyboardInterrupt:
            raise TrainingInterrupted(_interrupted_message(run, state.step, state.saved_step)) from None
        finally:
            if state.bar is not None:
                state.bar.close()
        # finish: sample outputs, the held-out scores, the figures, and where everything is
        if not ranks.is_main:
            return state.result(wall_time=time.perf_counter() - state.start_time)
        return finish(state, figures, lang)


@dataclass
class TrainState:
    """What one call of ``train`` works on: made by ``set_up``, advanced by ``train_step`` and
    ``end_of_epoch``, summed up by ``finish``."""

    config: TrainConfig
    run: RunFolder
    log: object  # where the messages go
    data: object  # a TaskData: the examples (or text) and the vocabularies
    model: object
    optimizer: object
    scheduler: object  # None: a constant learning rate
    loader: object  # the training minibatches (Batches): it knows the epoch and the position in it
    heldout_arrays: tuple
    total_steps: int
    history: dict  # {"loss": one per step, "eval": one per epoch, "steps_per_epoch"}: saved with the checkpoint
    start_time: float  # when this call of train began
    step: int = 0  # the steps taken, by every call together
    saved_step: int | None = None  # the step of the checkpoint on disk; None: nothing saved yet
    best_loss: float = math.inf  # the held-out loss of the weights in best/
    metrics: dict = field(default_factory=dict)  # the latest evaluation
    bar: object = None  # the progress bar, on a terminal
    steps_start: float = 0.0  # when this call's first step began (for tokens/s)
    first_step: int = 0  # the step this call began at (for the time per step)
    tokens_seen: int = 0  # the target tokens this call has trained on, on every rank (for tokens/s)
    world: object = None  # the processes training together (distributed.World); None: this one alone
    read_every: int = 1  # read the steps' numbers every this many steps (READ_EVERY on a device)
    unread: list = field(default_factory=list)  # the StepNumbers not read yet (read_losses)
    graphed: object = None  # --cuda-graph: forward and backward replayed as CUDA graphs (graphed.py)

    def result(self, **changes):
        """The ``TrainResult`` of the run as it stands."""
        return TrainResult(
            self.model,
            self.config,
            self.data.src_vocab,
            self.data.tgt_vocab,
            self.history,
            self.step,
            _epochs_done(self.loader),
            heldout_loss=self.metrics.get("loss"),
            accuracy=self.metrics.get("exact_match"),
            bleu=self.metrics.get("bleu"),
            checkpoint=self.run.checkpoint,
            **changes,
        )

    def tokens_per_second(self):
        return self.tokens_seen / max(time.perf_counter() - self.steps_start, 1e-9)

    def ms_per_step(self):
        """Wall time per step of this call, evaluations included, in milliseconds."""
        return 1000 * (time.perf_counter() - self.steps_start) / max(self.step - self.first_step, 1)

    def speed(self):
        """'<ms> ms/step, <n> tokens/s', averaged since this process began training: what the log lines end with."""
        return f"{self.ms_per_step():.1f} ms/step, {self.tokens_per_second():,.0f} tokens/s"


# -- set up ---------------------------------------------------------------------------------------
def set_up(config, run, log, resume, ranks=None):
    """The ``TrainState`` of a run about to train: data, model, minibatches, optimiser and
    schedule made from ``config`` (the seed first, so the same config makes the same run); with
    ``resume``, the weights, optimiser, schedule, minibatch position and history are then
    loaded from the checkpoint in ``run``. Logs what is about to train.

    With several ``ranks`` (data parallelism), every rank does the same, reads only its shard of
    each minibatch, takes rank 0's parameters, and draws dropout from a stream of its own."""
    ranks = ranks or world()
    start_time = time.perf_counter()
    if resume:
        # the config first: a different model would fail below with a list of shapes instead
        saved, saved_info = load_run_checkpoint(run.checkpoint)
        _check_resumable(saved, config)
    manual_seed(config.seed)
    set_float32_matmul_precision(config.matmul_precision)
    # a BPE run trains its tokenizer once and keeps it in the run folder; a resumed run reads it
    # (and checks it against the checkpoint's vocabulary)
    tokenizer = None
    if resume and config.tokenizer == "bpe":
        tokenizer = load_tokenizer(run.path, config, saved_info["vocabs"].get("tgt"))
    data = build_data(config, tokenizer=tokenizer)
    if data.tokenizer is not None and not resume and ranks.rank == 0:
        data.tokenizer.save(os.path.join(run.path, TOKENIZER_FILE))
    check_fits_device(config, len(data.src_vocab), len(data.tgt_vocab))
    model = build_model(config, data.src_vocab, data.tgt_vocab)
    train_arrays, heldout_arrays = _arrays(config, data, "train"), _arrays(config, data, "heldout")
    epoch_size = None
    if config.model == "lm" and config.lm_sampling == "random":
        # every window of the text (views, no copy), as many drawn per epoch as partition has
        epoch_size = len(train_arrays[0])
        train_arrays = lm_arrays(data.train, data.num_steps)
    loader = Batches(
        *train_arrays,
        batch_size=config.batch_size,
        shuffle=True,
        device=config.device,
        shard=(ranks.rank, ranks.size),
        epoch_size=epoch_size,
    )
    steps_per_epoch = len(loader)
    total_steps = config.steps or config.epochs * steps_per_epoch
    optimizer = build_optimizer(config, model)
    scheduler = build_scheduler(config, optimizer, total_steps)
    history = {"loss": [], "eval": [], "steps_per_epoch": steps_per_epoch}
    step, saved_step, best_loss = 0, None, math.inf

    if resume:
        info = load_checkpoint(run.checkpoint, model, optimizer, scheduler, map_device=config.device)
        loader.load_state_dict(info["extra"]["batches"])
        history, step = info["extra"]["history"], info["step"]
        saved_step, best_loss = step, run.best_loss()
        if isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps != cosine_end(total_steps):
            log(f"note: the cosine schedule now ends at step {total_steps} instead of {scheduler.total_steps}")
            scheduler.total_steps = cosine_end(total_steps)
        log(
            f"resuming {run.display} at step {step} (epoch {_epochs_done(loader)})"
            + (", in bfloat16 autocast" if config.autocast else "")
            + _workers(ranks)
        )
    else:
        num_params = sum(p.numel() for p in model.parameters())
        what = f"{len(data.train):,} training and {len(data.heldout):,} held-out " + (
            "examples" if config.model != "lm" else "characters" if data.tokenizer is None else "BPE tokens"
        )
        if data.tokenizer is not None:
            ratio = data.heldout_chars / len(data.heldout)
            what += f" (a vocabulary of {len(data.tokenizer)}, {ratio:.2f} characters per token)"
        log(
            f"minitensor train: {config.model} ({num_params:,} parameters; {_plugins(config)}) on the "
            f"{config.source_name}: {what}; "
            f"{steps_per_epoch} steps per epoch, {total_steps} steps, batch {config.batch_size}, "
            f"{config.optimizer} lr {config.lr:g} ({config.schedule}), device {config.device}"
            + (" (bfloat16 autocast)" if config.autocast else "")
            + f", seed {config.seed}"
            + _workers(ranks)
        )
    if ranks.size > 1:
        broadcast_parameters(model.parameters(), ranks)  # identical replicas, whatever each rank did
        if ranks.rank > 0:  # dropout: a stream per rank, reproducible from (seed, rank, step)
            manual_seed(rank_seed(config.seed, ranks.rank, step))

    return TrainState(
        config,
        run,
        log,
        data,
        model,
        optimizer,
        scheduler,
        loader,
        heldout_arrays,
        total_steps,
        history,
        start_time,
        step=step,
        saved_step=saved_step,
        best_loss=best_loss,
        metrics=history["eval"][-1] if history["eval"] else {},
        bar=_progress_bar(config, total_steps, step) if ranks.is_main else None,
        steps_start=time.perf_counter(),
        first_step=step,
        world=ranks,
        # on the CPU, reading is free; several ranks add their losses up on the host anyway
        read_every=1 if get_backend(config.device).on_host or ranks.size > 1 else READ_EVERY,
        graphed=GraphedStep(lambda b: _loss(model, b, config, _pad(data.tgt_vocab)), optimizer, config.autocast)
        if config.cuda_graph
        else None,
    )


def _workers(ranks):
    return f", {ranks.size} workers (data parallel over MPI)" if ranks.size > 1 else ""


def _silent(*_):
    """The log of ranks other than 0."""


# -- one step -------------------------------------------------------------------------------------
def train_step(state, batch):
    """One step on a minibatch: the loss (teacher forcing), its gradients, clipped to
    ``config.clip_grad_norm``, the optimiser's update and the schedule's next learning rate.

    A loss or gradient norm that is NaN or inf raises ``TrainingError`` naming the step. On the
    CPU (``state.read_every == 1``) both are read at once, and it is raised before any weight
    changes. On a device nothing is read here: the step's numbers wait on the device and
    ``read_losses`` reads them with the next ones, every ``READ_EVERY`` steps; a diverged step
    is found there, by then some updates later, always before a checkpoint is written."""
    config, model = state.config, state.model
    state.step += 1  # the step being taken: messages count from 1
    read_now = state.read_every == 1
    if state.world is not None and state.world.size > 1:
        value, num_tokens = _distributed_backward(state, batch)
        numbers = StepNumbers(state.step, state.loader.epoch, value, num_tokens)
    elif (replayed := state.graphed(batch) if state.graphed is not None else None) is not None:
        numbers = StepNumbers(state.step, state.loader.epoch, *replayed)  # forward and backward in one launch
    else:
        loss, num_tokens = _loss(model, batch, config, _pad(state.data.tgt_vocab))
        numbers = StepNumbers(state.step, state.loader.epoch, loss.detach(), num_tokens)
        if read_now:
            _checked([numbers], config)  # a NaN loss: stopped before backward
        state.optimizer.zero_grad()
        loss.backward()
    if config.clip_grad_norm:  # on the global gradient: every rank clips the same way
        numbers.norm = clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        if read_now:
            _checked([numbers], config)  # a NaN gradient norm: stopped before the update
    state.optimizer.step()
    if state.scheduler is not None:
        state.scheduler.step()
    state.unread.append(numbers)
    if state.step % state.read_every == 0 or state.step == state.total_steps:
        read_losses(state)
    if state.bar is not None:
        if state.step % READ_EVERY == 0 or state.step == state.total_steps:  # shown by the update below
            loss_shown = f"{state.history['loss'][-1]:.3f}"
            state.bar.set_postfix(loss=loss_shown, tok_s=f"{state.tokens_per_second():,.0f}", refresh=False)
        state.bar.update(1)


@dataclass
class StepNumbers:
    """What one step reports: its loss, the number of target tokens it trained on and the
    gradient norm before clipping (None: no clipping). Each is a Python number or, until
    ``read_losses`` reads it, a 0-d Tensor on the training device."""

    step: int
    epoch: int
    loss: object
    tokens: object
    norm: object = None


def read_losses(state):
    """Read the numbers of the steps taken since the last read (one transfer for all), stop
    the run at the first that diverged (``TrainingError`` naming its step), and add them to
    ``history["loss"]`` and the token count."""
    unread, state.unread = state.unread, []
    for numbers in _checked(unread, state.config):
        state.history["loss"].append(numbers.loss)
        state.tokens_seen += numbers.tokens


def _checked(records, config):
    """``records`` (StepNumbers) with their numbers on the host, read in one transfer, after a
    ``TrainingError`` for the first non-finite loss or gradient norm among them."""
    on_device = [
        (r, name) for r in records for name in ("loss", "tokens", "norm") if isinstance(getattr(r, name), Tensor)
    ]
    if on_device:
        # float64 holds a float32 loss and an integer count exactly: one array, one transfer
        values = stack([getattr(r, name).astype("float64") for r, name in on_device]).numpy().tolist()
        for (r, name), value in zip(on_device, values):
            setattr(r, name, int(value) if name == "tokens" else value)
    for r in records:
        for what, value in (("loss", r.loss), ("gradient norm", r.norm)):
            if value is not None and not math.isfinite(value):
                raise _diverged(what, value, r.step, r.epoch, config)
    return records


def _distributed_backward(state, batch):
    """This rank's forward and backward on its shard, then the all-reduce: every rank ends with
    the gradient of the global mean loss. Returns (global mean loss, global token count)."""
    config, model, ranks = state.config, state.model, state.world
    state.optimizer.zero_grad()
    if len(batch[0]):
        loss, num_tokens = _loss(model, batch, config, _pad(state.data.tgt_vocab))
        local, num_tokens = loss.item(), int(num_tokens)  # read: the ranks add them up on the host
    else:  # more ranks than rows in this minibatch: nothing to add but zeros
        loss, num_tokens, local = None, 0, 0.0
    # the global loss, sum_r n_r loss_r / N, and N: one small Allreduce, before any backward,
    # so that every rank stops together on a NaN
    total_loss, total_tokens = ranks.sum([local * num_tokens, num_tokens])
    value = total_loss / max(total_tokens, 1)
    if not math.isfinite(value):
        raise _diverged("loss", value, state.step, state.loader.epoch, config)
    if loss is not None:
        loss.backward()
    allreduce_gradients(model.parameters(), num_tokens, ranks)
    return value, int(total_tokens)


# -- the end of an epoch --------------------------------------------------------------------------
def end_of_epoch(state):
    """Evaluate on the held-out set, log the epoch's line, and save the checkpoint (and best/,
    when the held-out loss is the lowest so far)."""
    read_losses(state)  # the epoch's last losses, and a divergence found before anything is saved
    config, data, loader, step = state.config, state.data, state.loader, state.step
    metrics = {"epoch": loader.epoch + 1, "step": step, **evaluate(state.model, data, state.heldout_arrays, config)}
    state.metrics = metrics
    state.history["eval"].append(metrics)

    recent = state.history["loss"][-min(len(loader), len(state.history["loss"])) :]  # the last epoch's
    extra = (
        f"perplexity {metrics['perplexity']:.2f}"
        if config.model == "lm"
        else f"exact match {metrics['exact_match']:6.1%}  BLEU {metrics['bleu']:.3f}"
    )
    held = f"held-out loss {metrics['loss']:.4f}"
    if config.tokens == "bpe":  # per character too: what compares with a character model
        held += f" nats/token, {metrics['loss_per_char']:.4f} nats/char"
    message = (
        f"epoch {loader.epoch + 1:3d}  step {step:6d}  train loss {sum(recent) / len(recent):.4f}  "
        f"{held}  {extra}  "
        f"({time.perf_counter() - state.start_time:.1f} s, {state.speed()})"
    )
    _say(state, message)
    save_checkpoints(state)


def _say(state, message):
    if state.bar is not None and state.log is print:
        state.bar.write(message, file=sys.stderr)  # above the bar, not through it
    else:
        state.log(message)


def estimate_losses(state):
    """nanoGPT's ``estimate_loss``, every ``eval_interval`` steps: the mean loss of ``eval_iters``
    minibatches (of ``batch_size`` rows, drawn with replacement, from a generator of their own:
    the training's draws are left as they were) of the training and of the held-out set, logged
    as "step N: train loss X, val loss Y" and kept in ``history["estimates"]``."""
    read_losses(state)
    config, data = state.config, state.data
    rng = numpy.random.default_rng([config.seed, state.step])
    # eval_iters x batch_size rows (up to 1,000,000 x batch_size) are gathered a chunk at a time,
    # whole evaluation batches each: the rows are drawn in the same order as all at once would be
    chunk = config.eval_batch_size * max(1, ESTIMATE_CHUNK_ROWS // config.eval_batch_size)
    rows_wanted = config.eval_iters * config.batch_size
    losses = {}
    for name, arrays in (("train", state.loader.arrays), ("val", state.heldout_arrays)):
        total, count = 0.0, 0
        for start in range(0, rows_wanted, chunk):
            rows = rng.integers(0, len(arrays[0]), size=min(chunk, rows_wanted - start))
            part = [numpy.asarray(a)[rows] for a in arrays]
            part_total, part_count = summed_loss(state.model, part, config, _pad(data.tgt_vocab))
            total, count = total + part_total, count + part_count
        losses[name] = total / max(count, 1)
    state.history.setdefault("estimates", []).append({"step": state.step, **losses})
    _say(
        state,
        f"step {state.step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} ({state.speed()})",
    )


def save_checkpoints(state):
    """best/ (when the latest held-out loss is the lowest so far) and checkpoint/, with Ctrl-C
    held back until both are written."""
    read_losses(state)  # the history saved is complete (nothing left to read after end_of_epoch)
    config, data, step, epoch = state.config, state.data, state.step, _epochs_done(state.loader)
    vocabs = {"src": data.src_vocab, "tgt": data.tgt_vocab}
    shapes = {"num_steps": data.num_steps, "tgt_num_steps": data.tgt_num_steps}
    with _complete_before_interrupt():
        # best/ first: a kill between the two saves then repeats this epoch on resume,
        # and the repeat finds best/ already up to date
        if state.metrics["loss"] < state.best_loss:
            state.best_loss = state.metrics["loss"]
            save_checkpoint(
                state.run.best,
                state.model,
                config=config.to_dict(),
                vocabs=vocabs,
                extra={**shapes, "heldout_loss": state.best_loss},
                step=step,
                epoch=epoch,
            )
        save_checkpoint(
            state.run.checkpoint,
            state.model,
            state.optimizer,
            state.scheduler,
            config=config.to_dict(),
            vocabs=vocabs,
            extra={"batches": state.loader.state_dict(), "history": state.history, **shapes},
            step=step,
            epoch=epoch,
        )
        state.saved_step = step  # before a held-back Ctrl-C is raised, so its message names this step


# -- finish ---------------------------------------------------------------------------------------
def finish(state, figures=True, lang="en"):
    """The final report (sample outputs, the held-out scores, the figures) and the result."""
    result = state.result()
    _report(result, state.data, state.log, figures, lang=lang)
    result.wall_time = time.perf_counter() - state.start_time
    command = "generate" if state.config.model == "lm" else "translate"  # the next thing a learner runs
    state.log(
        f"wall time {result.wall_time:.1f} s; run folder {state.run.path}: best/ (the lowest held-out loss, "
        f"{state.best_loss:.4f}: what `minitensor {command} --checkpoint {state.run.path}` loads) and "
        "checkpoint/ (the latest, for --resume)"
    )
    if result.figures:
        state.log("figures: " + ", ".join(os.path.abspath(f) for f in result.figures))
    return result


# -- the final report -----------------------------------------------------------------------------
def _report(result, data, log, figures=True, num_samples=5, lang="en"):
    """Sample outputs, the held-out scores, and the figures (loss curve, attention)."""
    config, model = result.config, result.model
    if config.model == "lm":
        _report_lm(result, data, log)
    else:
        examples = data.heldout[:num_samples]
        hyps = translate(
            model, [s for s, _ in examples], data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps
        )
        for (src, tgt), hyp in zip(examples, hyps):
            score = bleu(hyp.tokens, tgt, k=min(4, len(tgt)))
            result.samples.append(
                (detokenize(config, src), detokenize(config, hyp.tokens), detokenize(config, tgt), score)
            )
            mark = "ok " if hyp.tokens == list(tgt) else "BAD"
            log(
                f"  {mark} {detokenize(config, src)!r} => {detokenize(config, hyp.tokens)!r}  "
                f"(reference {detokenize(config, tgt)!r}, BLEU {score:.3f})"
            )
        log(
            f"held-out exact match {result.accuracy:.1%} ({len(data.heldout):,} examples, greedy decoding), "
            f"BLEU {result.bleu:.3f}, loss {result.heldout_loss:.4f}"
        )
    if not figures:
        return
    try:
        result.figures.extend(save_figures(result, data, lang))
    except ModuleNotFoundError as e:  # a broken installation: the run itself is saved, say what is missing
        log(f"no figures: {e}")


def _report_lm(result, data, log, num_samples=2, length=160):
    """The best held-out loss against the unigram baseline, and samples from the best weights,
    each continuing held-out text that starts at a word."""
    config, vocab = result.config, data.tgt_vocab
    best = min(result.history["eval"], key=lambda e: e["loss"])
    model = build_model(config, vocab, vocab)  # the best weights, what generate will load; result.model is the last
    load_checkpoint(os.path.join(config.out, BEST_DIR), model, restore_rng=False, map_device=config.device)
    baseline = unigram_baseline(data.train, data.heldout, len(vocab))
    if data.tokenizer is None:
        log(
            f"held-out loss {best['loss']:.4f} nats per character (the best, after step {best['step']}; perplexity "
            f"{math.exp(min(best['loss'], 50)):.2f}); a unigram model (character frequencies alone) scores "
            f"{baseline:.4f}: {_compared(best['loss'], baseline)}"
        )
    else:  # per token, and per character: what compares with a character model's loss
        per_char = best.get("loss_per_char", math.nan)
        log(
            f"held-out loss {best['loss']:.4f} nats/token, {per_char:.4f} nats/char (the best, after step "
            f"{best['step']}; perplexity {math.exp(min(best['loss'], 50)):.2f} per token); a unigram model (token "
            f"frequencies alone) scores {baseline:.4f} nats/token: {_compared(best['loss'], baseline)}"
        )
    text = vocab.to_tokens(list(data.heldout))
    if data.tokenizer is None:  # prompts that start at a word: after a space, 24 characters
        starts, size = [i + 1 for i, c in enumerate(text[:-40]) if c == " " and text[i + 1].isalpha()], 24
    else:  # a BPE token " word" ("Ġword") starts a word; 6 tokens are about as long
        starts, size = [i for i, t in enumerate(text[:-40]) if t[:1] == "Ġ" and t[1:2].isalpha()], 6
    rng = numpy.random.default_rng(config.seed)  # the same samples for the same run
    for k in range(num_samples):
        start = starts[k * len(starts) // num_samples] if starts else 0
        prompt = text[start : start + size]
        hyp = generate(
            model, prompt, vocab, length, temperature=SAMPLE_TEMPERATURE, rng=rng, window=config.lm_num_steps
        )
        sample = detokenize(config, hyp.tokens)
        result.samples.append(sample)
        shown = detokenize(config, prompt)
        log(f"sample {k + 1} (held-out prompt {shown!r}, temperature {SAMPLE_TEMPERATURE}): {sample!r}")


def _compared(loss, baseline):
    """'46% lower' (or 'higher': a model not yet better than character frequencies)."""
    change = 1 - loss / baseline
    return f"{abs(change):.0%} {'lower' if change >= 0 else 'higher'}"


def save_figures(result, data, lang="en"):
    """The loss curve and, for a seq2seq model, the attention on the first held-out example;
    labelled in ``lang`` ("en" or "zh")."""
    config, model = result.config, result.model
    os.makedirs(config.out, exist_ok=True)
    paths = [os.path.join(config.out, "loss.png")]
    lang, _ = drawn_lang(lang)  # English when no font can draw the Chinese
    source = config.source_name
    if not (config.text or config.data):  # a task (a file's name is drawn as it is)
        source = label("{task} task", lang, task=config.task)
    title = label("{model} on the {source}", lang, model=config.model, source=source)
    plot_loss(result.history, path=paths[0], smooth=0.9, title=title, lang=lang)
    if config.model == "lm" or not data.heldout:
        return paths
    src, _ = data.heldout[0]
    if config.model == "bahdanau":
        hyp = translate(
            model, src, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps, attention=True
        )
        rows = hyp.tokens + (["<eos>"] if hyp.ended else [])
        path = os.path.join(config.out, "attention.png")
        plot_seq2seq_attention(hyp.attention, list(src) + ["<eos>"], rows, path=path, lang=lang)
        return paths + [path]
    return paths + attention_figures(
        model, src, data.src_vocab, data.tgt_vocab, data.tgt_num_steps, config.out, lang=lang
    )


def attention_figures(model, src, src_vocab, tgt_vocab, max_len, folder, prefix="attention", lang="en"):
    """Greedy-decode ``src``, run the model once more teacher-forced on its own output, and draw
    the three attention maps of a Transformer (no padding: the source is exactly its tokens),
    labelled in ``lang``."""
    hyp = translate(model, list(src), src_vocab, tgt_vocab, len(src) + 1, max_len=max_len)
    enc_X, enc_valid_lens = build_array([list(src)], src_vocab, len(src) + 1)
    dec_in = [tgt_vocab.bos] + tgt_vocab[list(hyp.tokens)]
    device = next(iter(model.parameters())).device
    was_training = model.training
    model.eval()
    try:
        with no_grad(), plain_attention(model):  # a long source would stream and keep no weights
            model(
                tensor(enc_X, device=device),
                tensor(numpy.array([dec_in]), device=device),
                tensor(enc_valid_lens, device=device),
            )
        plot_transformer_attention(
            model, list(src) + ["<eos>"], ["<bos>"] + list(hyp.tokens), folder=folder, prefix=prefix, lang=lang
        )
    finally:
        model.train(was_training)
    return [os.path.join(folder, f"{prefix}_{k}.png") for k in ("encoder_self", "decoder_self", "cross")]
