"""The training loop: data, model, optimiser, schedule, evaluation, checkpoints, pictures.

    from minitensor.train import TrainConfig, train
    result = train(TrainConfig(task="date", epochs=4, out="runs/date"))
    result.accuracy, result.checkpoint, result.figures

One step (teacher forcing, D2L 10.7): the decoder reads the target shifted right by <bos>
and predicts the target itself; the loss is the cross-entropy over the valid (non-padding)
target positions, optionally label-smoothed; gradients are clipped to a total norm, then
Adam(W) steps and the schedule sets the next learning rate (warm-up, then cosine decay).

After every epoch: the held-out loss, the exact-match accuracy of greedy decoding on the
held-out set (batched), a checkpoint. ``train(config, resume=True)`` continues from that
checkpoint exactly as the uninterrupted run would have gone on: the same data (rebuilt from
the seed), weights, optimiser moments, schedule, position in the epoch's shuffled order and
random generators (dropout), so the losses match bit for bit.

A loss that becomes NaN or inf stops the run at once with a ``TrainingError`` naming the
step: continuing would only turn every weight into NaN.
"""

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy

from .config import TrainConfig, build_data, build_model, build_optimizer, build_scheduler, detokenize

CHECKPOINT_DIR = "checkpoint"
# fields that may change between a run and its resumption: none of them shapes the model,
# the data or the order of the minibatches
RESUMABLE_CHANGES = ("epochs", "steps", "progress", "out", "device", "eval_batch_size")


class TrainingError(RuntimeError):
    """Training cannot go on: the loss diverged, or a checkpoint does not fit the run."""


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
    accuracy: Optional[float] = None      # held-out exact match (seq2seq)
    heldout_loss: Optional[float] = None
    bleu: Optional[float] = None          # held-out corpus BLEU (seq2seq)
    samples: list = field(default_factory=list)  # (source, prediction, reference, BLEU) / generated text
    checkpoint: Optional[str] = None
    figures: list = field(default_factory=list)
    wall_time: float = 0.0
    finished: bool = True                 # False when stopped early by ``stop_after_epochs``


# -- one step -------------------------------------------------------------------------------------
def _loss(model, batch, config, pad):
    """(loss, number of target tokens) of one minibatch."""
    from ..ops.loss import cross_entropy

    if config.model == "lm":
        X, Y = batch
        return cross_entropy(model(X), Y, label_smoothing=config.label_smoothing), Y.numel()
    enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y = batch
    logits = model(enc_X, dec_X, enc_valid_lens)
    # The valid positions of Y never hold <pad> (it is no token of the data), so ignoring
    # <pad> is D2L's mask by dec_valid_lens.
    loss = cross_entropy(logits, Y, ignore_index=pad, label_smoothing=config.label_smoothing)
    return loss, int(dec_valid_lens.numpy().sum())


def _arrays(config, data, which):
    from ..data import lm_arrays, seq2seq_arrays

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
    from .. import no_grad
    from ..ops.loss import cross_entropy
    from ..tensor import tensor

    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    n, size = len(arrays[0]), config.eval_batch_size
    try:
        with no_grad():
            for i in range(0, n, size):
                batch = [tensor(a[i:i + size], device=config.device) for a in arrays]
                if config.model == "lm":
                    X, Y = batch
                    loss, tokens = cross_entropy(model(X), Y, reduction="sum"), Y.numel()
                else:
                    enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y = batch
                    loss = cross_entropy(model(enc_X, dec_X, enc_valid_lens), Y, ignore_index=pad, reduction="sum")
                    tokens = int(dec_valid_lens.numpy().sum())
                total += loss.item()
                count += tokens
    finally:
        model.train(was_training)
    return total / max(count, 1)


def decode_heldout(model, pairs, data, config, beam_size=1):
    """Greedy (or beam) translations of every held-out source, in batches: token lists."""
    from .decoding import translate

    preds = []
    for i in range(0, len(pairs), config.eval_batch_size):
        chunk = [s for s, _ in pairs[i:i + config.eval_batch_size]]
        hyps = translate(model, chunk, data.src_vocab, data.tgt_vocab, data.num_steps, beam_size=beam_size,
                         max_len=data.tgt_num_steps)
        preds.extend(h.tokens for h in hyps)
    return preds


def evaluate(model, data, heldout_arrays, config):
    """{"loss": held-out loss, "exact_match", "bleu"} (seq2seq) or {"loss", "perplexity"} (LM)."""
    from ..metrics import corpus_bleu, exact_match

    loss = heldout_loss(model, heldout_arrays, config, data.tgt_vocab.pad)
    if config.model == "lm":
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}
    preds = decode_heldout(model, data.heldout, data, config)
    labels = [t for _, t in data.heldout]
    return {"loss": loss, "exact_match": exact_match(preds, labels), "bleu": corpus_bleu(preds, labels)}


# -- helpers --------------------------------------------------------------------------------------
def _progress_bar(config, total, initial):
    """A tqdm bar on a terminal (tqdm imported only now), else None."""
    if not config.progress or not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, leave=False, file=sys.stderr)


def _diverged(what, value, step, epoch, config):
    return TrainingError(
        f"the training {what} became {value} at step {step} (epoch {epoch + 1}): training diverged and was stopped. "
        f"Try a lower learning rate, e.g. --lr {config.lr / 10:g} (now {config.lr:g})"
        + ("" if config.clip_grad_norm else ", or clip the gradients") + "."
    )


def _check_resumable(saved, config):
    saved = TrainConfig.from_dict(saved).to_dict()
    now = config.to_dict()
    changed = [f"{k}: {saved[k]!r} -> {now[k]!r}" for k in now if k not in RESUMABLE_CHANGES and saved[k] != now[k]]
    if changed:
        raise TrainingError("cannot resume: the checkpoint was trained with a different configuration ("
                            + "; ".join(changed) + "); resume with the same settings, or start afresh in a new --out")


def _epochs_done(loader):
    return loader.epoch + (1 if loader.position >= len(loader) else 0)


# -- the loop -------------------------------------------------------------------------------------
def train(config=None, log=print, *, resume=False, stop_after_epochs=None):
    """Train the model ``config`` describes (default: ``TrainConfig()``); returns a ``TrainResult``.

    ``log``: where the messages go (one string per call). ``resume``: continue from the
    checkpoint in ``config.out`` (exactly, see the module docstring); only the fields in
    ``RESUMABLE_CHANGES`` may differ from the saved config -- more ``epochs`` or ``steps``
    extend the run (a cosine schedule is stretched to the new end). ``stop_after_epochs``:
    stop after this many epochs *of this call*, as an interruption would (checkpoint
    written, no final report); ``result.finished`` is then False.

    Raises ``TrainingError`` when the loss (or the gradient norm) becomes NaN or inf.
    """
    import minitensor as mt

    from ..data import Batches
    from ..optim import WarmupCosineLR, clip_grad_norm_
    from .checkpoint import load_checkpoint, save_checkpoint

    config = (config or TrainConfig()).validate()
    start_time = time.perf_counter()
    mt.manual_seed(config.seed)
    data = build_data(config)
    model = build_model(config, data.src_vocab, data.tgt_vocab)
    train_arrays, heldout_arrays = _arrays(config, data, "train"), _arrays(config, data, "heldout")
    loader = Batches(*train_arrays, batch_size=config.batch_size, shuffle=True, device=config.device)
    steps_per_epoch = len(loader)
    total_steps = config.steps or config.epochs * steps_per_epoch
    optimizer = build_optimizer(config, model)
    scheduler = build_scheduler(config, optimizer, total_steps)
    history = {"loss": [], "eval": [], "steps_per_epoch": steps_per_epoch}
    step = 0
    ckpt_dir = os.path.join(config.out, CHECKPOINT_DIR)
    num_params = sum(p.numel() for p in model.parameters())

    if resume:
        # the config first: a different model would fail below with a list of shapes instead
        _check_resumable(load_checkpoint(ckpt_dir, restore_rng=False)["config"], config)
        info = load_checkpoint(ckpt_dir, model, optimizer, scheduler, map_device=config.device)
        loader.load_state_dict(info["extra"]["batches"])
        history, step = info["extra"]["history"], info["step"]
        if isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps != total_steps:
            log(f"note: the cosine schedule now ends at step {total_steps} instead of {scheduler.total_steps}")
            scheduler.total_steps = total_steps
        log(f"resuming from {ckpt_dir} at step {step} (epoch {_epochs_done(loader)})")
    else:
        what = (f"{len(data.train):,} training and {len(data.heldout):,} held-out "
                + ("characters" if config.model == "lm" else "examples"))
        log(f"minitensor train: {config.model} ({num_params:,} parameters; scorer {build_scorer_name(config)}, "
            f"pooling {config.pooling}, positional {config.positional}) on the {config.source_name}: {what}; "
            f"{steps_per_epoch} steps per epoch, {total_steps} steps, batch {config.batch_size}, "
            f"{config.optimizer} lr {config.lr:g} ({config.schedule}), device {config.device}, seed {config.seed}")

    pad = data.tgt_vocab.pad
    bar = _progress_bar(config, total_steps, step)
    epochs_this_call, tokens_seen, run_start = 0, 0, time.perf_counter()
    metrics = history["eval"][-1] if history["eval"] else {}
    try:
        while step < total_steps:
            model.train()
            for batch in loader:
                step += 1
                loss, num_tokens = _loss(model, batch, config, pad)
                value = loss.item()
                if not math.isfinite(value):
                    raise _diverged("loss", value, step, loader.epoch, config)
                optimizer.zero_grad()
                loss.backward()
                if config.clip_grad_norm:
                    norm = float(clip_grad_norm_(model.parameters(), config.clip_grad_norm).item())
                    if not math.isfinite(norm):
                        raise _diverged("gradient norm", norm, step, loader.epoch, config)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                history["loss"].append(value)
                tokens_seen += num_tokens
                if bar is not None:
                    if step % 10 == 0 or step == total_steps:  # shown by the update below
                        rate = tokens_seen / max(time.perf_counter() - run_start, 1e-9)
                        bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
                    bar.update(1)
                if step >= total_steps:
                    break
            # the end of an epoch, or of the run in the middle of one
            epoch = _epochs_done(loader)
            metrics = {"epoch": loader.epoch + 1, "step": step, **evaluate(model, data, heldout_arrays, config)}
            history["eval"].append(metrics)
            recent = history["loss"][-min(steps_per_epoch, len(history["loss"])):]
            rate = tokens_seen / max(time.perf_counter() - run_start, 1e-9)
            extra = (f"perplexity {metrics['perplexity']:.2f}" if config.model == "lm"
                     else f"exact match {metrics['exact_match']:6.1%}  BLEU {metrics['bleu']:.3f}")
            message = (f"epoch {loader.epoch + 1:3d}  step {step:6d}  train loss {sum(recent) / len(recent):.4f}  "
                       f"held-out loss {metrics['loss']:.4f}  {extra}  "
                       f"({time.perf_counter() - start_time:.1f} s, {rate:,.0f} tokens/s)")
            if bar is not None:
                bar.write(message, file=sys.stderr) if log is print else log(message)
            else:
                log(message)
            save_checkpoint(ckpt_dir, model, optimizer, scheduler, config=config.to_dict(),
                            vocabs={"src": data.src_vocab, "tgt": data.tgt_vocab},
                            extra={"batches": loader.state_dict(), "history": history, "num_steps": data.num_steps,
                                   "tgt_num_steps": data.tgt_num_steps}, step=step, epoch=epoch)
            epochs_this_call += 1
            if stop_after_epochs is not None and epochs_this_call >= stop_after_epochs and step < total_steps:
                return TrainResult(model, config, data.src_vocab, data.tgt_vocab, history, step, epoch,
                                   checkpoint=ckpt_dir, wall_time=time.perf_counter() - start_time, finished=False,
                                   heldout_loss=metrics.get("loss"), accuracy=metrics.get("exact_match"),
                                   bleu=metrics.get("bleu"))
    finally:
        if bar is not None:
            bar.close()

    result = TrainResult(model, config, data.src_vocab, data.tgt_vocab, history, step, _epochs_done(loader),
                         heldout_loss=metrics.get("loss"), accuracy=metrics.get("exact_match"),
                         bleu=metrics.get("bleu"), checkpoint=ckpt_dir)
    _report(result, data, log)
    result.wall_time = time.perf_counter() - start_time
    log(f"wall time {result.wall_time:.1f} s; checkpoint: {os.path.abspath(ckpt_dir)}")
    if result.figures:
        log("figures: " + ", ".join(os.path.abspath(f) for f in result.figures))
    return result


def build_scorer_name(config):
    from .config import model_scorer

    return model_scorer(config)


# -- the final report -----------------------------------------------------------------------------
def _report(result, data, log, num_samples=5):
    """Sample outputs, the held-out scores, and the figures (loss curve, attention)."""
    from ..metrics import bleu
    from .decoding import generate, translate

    config, model = result.config, result.model
    if config.model == "lm":
        prompt = data.tgt_vocab.to_tokens(list(data.heldout[:20]))
        text = "".join(generate(model, prompt, data.tgt_vocab, max_len=100).tokens)
        result.samples.append(text)
        log(f"sample (prompt {''.join(prompt)!r}, greedy): {text!r}")
        log(f"held-out loss {result.heldout_loss:.4f}, perplexity {math.exp(min(result.heldout_loss, 50)):.2f}")
    else:
        examples = data.heldout[:num_samples]
        hyps = translate(model, [s for s, _ in examples], data.src_vocab, data.tgt_vocab, data.num_steps,
                         max_len=data.tgt_num_steps)
        for (src, tgt), hyp in zip(examples, hyps):
            score = bleu(hyp.tokens, tgt, k=min(4, len(tgt)))
            result.samples.append((detokenize(config, src), detokenize(config, hyp.tokens), detokenize(config, tgt),
                                   score))
            mark = "ok " if hyp.tokens == list(tgt) else "BAD"
            log(f"  {mark} {detokenize(config, src)!r} => {detokenize(config, hyp.tokens)!r}  "
                f"(reference {detokenize(config, tgt)!r}, BLEU {score:.3f})")
        log(f"held-out exact match {result.accuracy:.1%} ({len(data.heldout):,} examples, greedy decoding), "
            f"BLEU {result.bleu:.3f}, loss {result.heldout_loss:.4f}")
    try:
        result.figures.extend(save_figures(result, data))
    except ModuleNotFoundError as e:  # matplotlib is optional
        log(f"no figures: {e}")


def save_figures(result, data):
    """The loss curve and, for a seq2seq model, the attention on the first held-out example."""
    from .decoding import translate
    from .plots import plot_loss, plot_seq2seq_attention

    config, model = result.config, result.model
    os.makedirs(config.out, exist_ok=True)
    paths = [os.path.join(config.out, "loss.png")]
    plot_loss(result.history, path=paths[0], smooth=0.9, title=f"{config.model} on the {config.source_name}")
    if config.model == "lm" or not data.heldout:
        return paths
    src, _ = data.heldout[0]
    if config.model == "bahdanau":
        hyp = translate(model, src, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps,
                        attention=True)
        rows = hyp.tokens + (["<eos>"] if hyp.ended else [])
        path = os.path.join(config.out, "attention.png")
        plot_seq2seq_attention(hyp.attention, list(src) + ["<eos>"], rows, path=path)
        return paths + [path]
    return paths + attention_figures(model, src, data.src_vocab, data.tgt_vocab, data.tgt_num_steps, config.out)


def attention_figures(model, src, src_vocab, tgt_vocab, max_len, folder, prefix="attention"):
    """Greedy-decode ``src``, run the model once more teacher-forced on its own output, and draw
    the three attention maps of a Transformer (no padding: the source is exactly its tokens)."""
    from .. import no_grad
    from ..data import build_array
    from ..tensor import tensor
    from .decoding import translate
    from .plots import plot_transformer_attention

    hyp = translate(model, list(src), src_vocab, tgt_vocab, len(src) + 1, max_len=max_len)
    enc_X, enc_valid_lens = build_array([list(src)], src_vocab, len(src) + 1)
    dec_in = [tgt_vocab.bos] + tgt_vocab[list(hyp.tokens)]
    device = next(iter(model.parameters())).device
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            model(tensor(enc_X, device=device), tensor(numpy.array([dec_in]), device=device),
                  tensor(enc_valid_lens, device=device))
        plot_transformer_attention(model, list(src) + ["<eos>"], ["<bos>"] + list(hyp.tokens), folder=folder,
                                   prefix=prefix)
    finally:
        model.train(was_training)
    return [os.path.join(folder, f"{prefix}_{k}.png") for k in ("encoder_self", "decoder_self", "cross")]
