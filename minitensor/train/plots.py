"""Pictures of training: loss curves and attention heatmaps, written as PNG files.

- ``plot_loss(history, path)``: the training loss step by step (optionally smoothed) and the
  evaluation metrics epoch by epoch (held-out accuracy, BLEU ... on a second y axis);
- ``show_heatmaps(matrices, xlabel, ylabel, ...)``: D2L's ``d2l.show_heatmaps``, a grid of
  attention-weight matrices (num_rows, num_cols, Q, K) with one shared colour bar, plus token
  strings on the axes;
- ``plot_encoder_attention`` / ``plot_decoder_self_attention`` / ``plot_cross_attention``:
  the three kinds of attention of an encoder-decoder Transformer, one figure each, a row per
  block and a column per head; ``plot_transformer_attention`` draws all three from a model,
  ``plot_seq2seq_attention`` the single map of a Bahdanau (GRU + additive attention) decoder.

matplotlib is a dependency, but it is imported only when a picture is drawn, so
``import minitensor`` never pays for it. Figures
are drawn with matplotlib's object-oriented API on an Agg (PNG) canvas: no window, no
display needed, and ``matplotlib.pyplot``'s global state -- the backend a learner's notebook
has chosen, its list of open figures -- is left alone. Every function returns the
``matplotlib.figure.Figure``, so a notebook can display it (``display(fig)``) and a test can
read its tick labels; with ``path=`` the PNG is also written there, atomically (a temporary
file in the same folder, then a rename: a crash never leaves half a PNG behind).

Reading an attention map: row i is query i, column j is key j, the colour is the weight
alpha(q_i, k_j) -- each row of a softmax pooling sums to 1 over the keys the query may see.
"""

import numbers
import os
from collections.abc import Mapping, Sequence

import numpy

from ..atomic import write_atomic
from ..i18n import drawn_lang, label

__all__ = [
    "plot_loss",
    "show_heatmaps",
    "plot_encoder_attention",
    "plot_decoder_self_attention",
    "plot_cross_attention",
    "plot_transformer_attention",
    "plot_seq2seq_attention",
    "stack_decoding_steps",
]

_INSTALL_HINT = "pip install matplotlib (minitensor depends on it: was the installation incomplete?)"


# -- matplotlib, on first use ---------------------------------------------------------------------
def _new_figure(figsize, dpi, layout=None):
    """A Figure on an Agg canvas, importing matplotlib only now.

    No ``matplotlib.pyplot``: a Figure attached to ``FigureCanvasAgg`` renders to PNG with no
    GUI and no display, whatever backend the session uses, and is freed like any Python
    object (pyplot would keep it in its list of open figures until closed)."""
    try:  # lazily: importing minitensor.train (and `minitensor --help`) stays free of matplotlib
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ModuleNotFoundError(
            f"drawing figures needs matplotlib, which is not installed: {_INSTALL_HINT}", name="matplotlib"
        ) from e
    fig = Figure(figsize=figsize, dpi=dpi, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def _use_font(fig, family):
    """Draw every text of ``fig`` in ``family`` (a CJK font, for Chinese labels), falling back
    glyph by glyph to matplotlib's DejaVu Sans (digits, Latin letters, the minus sign). Set on
    the texts themselves, not in ``rcParams``: the figure keeps its font wherever it is drawn
    later, and the caller's settings are left alone."""
    if family is None:
        return
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_fontfamily([family, "DejaVu Sans"])


def _save(fig, path, dpi=None):
    """Write ``fig`` as a PNG to ``path`` (atomically: readers see the old file or the new one)."""
    if path is None:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi))


# -- arrays ----------------------------------------------------------------------------------------
def _to_numpy(x):
    """A Tensor (any device), a CuPy or NumPy array, or nested lists of them -> a float64 host array."""
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], numbers.Number):
        return numpy.stack([_to_numpy(item) for item in x])
    if hasattr(x, "detach") and callable(x.detach):
        x = x.detach()
    if hasattr(x, "numpy") and callable(x.numpy):  # minitensor.Tensor: always a host copy
        x = x.numpy()
    elif hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):  # a CuPy array
        x = x.get()
    return numpy.asarray(x, dtype=numpy.float64)


def _tokens(labels):
    """Token labels: a list of strings, or one string of character tokens ("2021-05-03")."""
    if labels is None:
        return None
    return [str(t) for t in labels]


# -- loss curves -----------------------------------------------------------------------------------
def _field(history, *names):
    """history[name] (a mapping) or history.name (any object) for the first name present."""
    for name in names:
        if isinstance(history, Mapping):
            if name in history:
                return history[name]
        elif hasattr(history, name):
            return getattr(history, name)
    return None


def _is_number(v):
    """A metric value worth drawing: a real number (Python's or NumPy's), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _train_series(values):
    """Training losses -> (steps, losses): a list of numbers (steps 1, 2, ...), of (step, loss)
    pairs, or of records {"step": ..., "loss": ...}."""
    if values is None:
        return numpy.zeros(0), numpy.zeros(0)
    steps, losses = [], []
    for i, v in enumerate(values):
        if isinstance(v, Mapping):
            step, loss = v.get("step", i + 1), v.get("loss", v.get("train_loss"))
        elif isinstance(v, (tuple, list)):
            step, loss = v
        else:
            step, loss = i + 1, v
        if loss is None:
            continue
        steps.append(float(step))
        losses.append(float(_to_numpy(loss)))
    return numpy.asarray(steps), numpy.asarray(losses)


def _eval_records(values):
    """Evaluations -> a list of dicts: a list of records ({"epoch": 1, "accuracy": 0.9, ...})
    or one dict of lists ({"epoch": [1, 2], "accuracy": [0.8, 0.9]})."""
    if values is None:
        return []
    if isinstance(values, Mapping):
        names = list(values)
        n = max((len(values[k]) for k in names), default=0)
        return [{k: values[k][i] for k in names if i < len(values[k])} for i in range(n)]
    return [dict(v) for v in values]


def _ema(values, weight):
    """Exponential moving average with TensorBoard's bias correction:
    s_t = weight * s_{t-1} + (1 - weight) * x_t, reported as s_t / (1 - weight^t)."""
    out, s = numpy.empty_like(values), 0.0
    for t, x in enumerate(values, 1):
        s = weight * s + (1.0 - weight) * x
        out[t - 1] = s / (1.0 - weight**t)
    return out


def plot_loss(
    history,
    path=None,
    smooth=None,
    metrics=None,
    title=None,
    logy=False,
    figsize=(6.4, 4.0),
    dpi=100,
    lang="en",
    labels=None,
):
    """Draw the training loss per step and the evaluation metrics per epoch; write a PNG.

    ``history``: a mapping (or an object with these attributes):

    - ``"loss"`` (or ``"train_loss"`` / ``"train"``): the training loss of every step, as
      numbers (steps 1, 2, ...), (step, loss) pairs, or records ``{"step": s, "loss": l}``.
      A plain list of numbers is taken as this alone.
    - ``"eval"`` (optional): one record per evaluation, ``{"epoch": 1, "step": 250,
      "accuracy": 0.91, "loss": 0.4}`` (or one dict of lists). A record is drawn at its
      ``"step"``; without one, at the end of its epoch (epoch * steps per epoch, the steps
      per epoch being ``history["steps_per_epoch"]`` or the number of training steps over
      the last epoch). Metrics whose name ends in ``loss`` share the loss axis; the others
      (accuracy, BLEU, exact match ...) go on a second y axis on the right.

    ``smooth``: None, or an exponential-moving-average weight in [0, 1) (0.9 is a good
    start) -- the raw curve stays, faint, behind the smoothed one. ``metrics``: the names of
    the eval metrics to draw (default: every numeric field other than epoch and step).
    ``logy``: a log scale for the loss axis. ``path``: where to write the PNG (None: only
    return the figure). ``lang``: "en" or "zh", the language of the axes and the legend
    (``minitensor.i18n``: 步, 损失, 训练损失 ...; Chinese needs a CJK font, else English and one
    warning); ``labels``: {English text: label} of your own, e.g. ``{"step": "iteration"}``;
    ``title`` is drawn as given. Returns the ``matplotlib.figure.Figure``.
    """
    if smooth is not None and not 0.0 <= smooth < 1.0:
        raise ValueError(f"plot_loss: smooth must be None or an EMA weight in [0, 1), got {smooth!r}")
    if isinstance(history, (Sequence, numpy.ndarray)) and not isinstance(history, (str, bytes)):
        history = {"loss": history}
    steps, losses = _train_series(_field(history, "loss", "train_loss", "train"))
    finite = numpy.isfinite(losses)  # a NaN loss would poison the moving average
    steps, losses = steps[finite], losses[finite]
    records = _eval_records(_field(history, "eval", "evals", "evaluation"))
    if metrics is None:
        metrics = []
        for r in records:
            metrics += [
                k
                for k, v in r.items()
                if k not in ("epoch", "step") and not k.startswith("_") and _is_number(v) and k not in metrics
            ]
    else:
        metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    if not len(losses) and not (records and metrics):
        raise ValueError("plot_loss: the history holds no training loss and no evaluation metric to draw")
    lang, family = drawn_lang(lang)

    def text(english, **fields):
        return label(english, lang, labels, **fields)

    def metric(name):  # a metric's name as drawn: the table's, else "metric {name}" in Chinese
        known = labels is not None and name in labels or lang == "en" or name in _METRICS
        return text(name) if known else text("metric {name}", name=name)

    # Where the evaluations sit on the x axis: the training steps, when there are any.
    epochs = [r.get("epoch") for r in records]
    per_epoch = _field(history, "steps_per_epoch")
    if per_epoch is None and len(steps) and any(e for e in epochs if e is not None):
        per_epoch = steps[-1] / max(e for e in epochs if e is not None)
    eval_x = []
    for i, r in enumerate(records):
        if r.get("step") is not None and len(steps):
            eval_x.append(float(r["step"]))
        elif r.get("epoch") is not None:
            eval_x.append(float(r["epoch"]) * per_epoch if len(steps) else float(r["epoch"]))
        else:
            eval_x.append(float(i + 1) * (per_epoch or 1.0) if len(steps) else float(i + 1))

    fig = _new_figure(figsize, dpi, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    lines = []
    if len(losses):
        if smooth:
            ax.plot(steps, losses, color="C0", alpha=0.25, linewidth=1.0)
            lines += ax.plot(
                steps,
                _ema(losses, smooth),
                color="C0",
                linewidth=1.8,
                label=text("training loss (EMA {weight:g})", weight=smooth),
            )
        else:
            lines += ax.plot(steps, losses, color="C0", linewidth=1.2, label=text("training loss"))
    ax.set_xlabel(text("step") if len(steps) else text("epoch"))
    ax.set_ylabel(text("loss"))
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)

    right, right_names = None, []
    for k, name in enumerate(metrics):
        xs = [x for x, r in zip(eval_x, records) if _is_number(r.get(name))]
        ys = [float(r[name]) for r in records if _is_number(r.get(name))]
        if not ys:
            continue
        style = dict(marker="o", markersize=4, color=f"C{k + 1}", label=text("eval {name}", name=metric(name)))
        if name.endswith("loss"):
            lines += ax.plot(xs, ys, linestyle="--", **style)
        else:
            if right is None:
                right = ax.twinx()
            lines += right.plot(xs, ys, **style)
            right_names.append(name)
    if right is not None:
        right.set_ylabel(metric(right_names[0]) if len(right_names) == 1 else text("metric"))
        values = numpy.concatenate([line.get_ydata() for line in right.get_lines()])
        if values.size and values.min() >= 0.0 and values.max() <= 1.0:
            right.set_ylim(0.0, 1.02)  # accuracies: the whole [0, 1] range reads honestly
    if lines:  # under the plot: inside, the second axis would draw its curves over it
        ax.legend(
            lines,
            [line.get_label() for line in lines],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=min(len(lines), 3),
            fontsize="small",
            frameon=False,
        )
    if title:
        ax.set_title(title)
    _use_font(fig, family)
    _save(fig, path)
    return fig


# The metric names that have a label of their own in minitensor.i18n (others: "metric {name}").
_METRICS = ("loss", "accuracy", "exact_match", "bleu", "perplexity", "loss_per_char")


# -- heatmaps --------------------------------------------------------------------------------------
def show_heatmaps(
    matrices,
    xlabel,
    ylabel,
    titles=None,
    path=None,
    figsize=None,
    cmap="Reds",
    row_labels=None,
    col_labels=None,
    row_titles=None,
    suptitle=None,
    vmin=None,
    vmax=None,
    dpi=100,
    lang="en",
    labels=None,
):
    """D2L's ``show_heatmaps``: a grid of heatmaps with one colour bar; write a PNG.

    ``matrices``: shape (num_rows, num_cols, Q, K) -- a Tensor, an array, or nested lists of
    them (a (Q, K) matrix is one panel, (num_cols, Q, K) one row of panels). ``xlabel``
    goes under the bottom row, ``ylabel`` beside the left column (D2L's "Keys" / "Queries").
    ``titles``: one per column (D2L), or a nested list with one per panel. ``row_titles``:
    one per row, written before the y label ("block 1" ...). ``row_labels`` / ``col_labels``:
    token strings for the Q rows / K columns (a string is a sequence of character tokens);
    each matrix is cut to their lengths, which drops padding. ``vmin``, ``vmax``: the colour
    range shared by all panels (default: 0 or the smallest value, and the largest).
    ``figsize``: the whole figure (default: 2.5 inches a panel, more for long token lists).
    ``lang``: "en" or "zh": with "zh" the labels are drawn in a CJK font, and those the library
    knows ("Keys", "Queries", "head {h}" ...: ``minitensor.i18n.LABELS``) in Chinese; a label it
    does not know is drawn as given (pass your own Chinese). ``labels``: {text: label} of your
    own, applied to the labels, titles and suptitle. Token labels are data, drawn as given.
    Returns the ``matplotlib.figure.Figure``.
    """
    data = _to_numpy(matrices)
    if data.ndim < 2 or data.ndim > 4:
        raise ValueError(f"show_heatmaps: matrices must be (num_rows, num_cols, Q, K), got shape {data.shape}")
    data = data.reshape((1,) * (4 - data.ndim) + data.shape)
    row_labels, col_labels = _tokens(row_labels), _tokens(col_labels)
    for tokens, axis, what in ((row_labels, 2, "row_labels (queries)"), (col_labels, 3, "col_labels (keys)")):
        if tokens is not None and len(tokens) > data.shape[axis]:
            raise ValueError(
                f"show_heatmaps: {len(tokens)} {what} for matrices of shape {data.shape} (only {data.shape[axis]})"
            )
    if row_labels is not None:
        data = data[:, :, : len(row_labels), :]
    if col_labels is not None:
        data = data[:, :, :, : len(col_labels)]
    num_rows, num_cols, Q, K = data.shape
    if not Q or not K:
        raise ValueError(f"show_heatmaps: nothing to draw in matrices of shape {data.shape}")

    if figsize is None:
        # About 2 inches for a panel's longer side, as D2L's 2.5 x 2.5, but at least 0.18 inch
        # a cell so that token labels stay legible; square cells, so a Q x K panel is K wide.
        cell = max(0.18, 2.0 / max(Q, K))
        figsize = (num_cols * (cell * K + 0.5) + 1.5, num_rows * (cell * Q + 0.6) + (0.4 if suptitle else 0.0) + 0.5)
    finite = data[numpy.isfinite(data)]
    if vmin is None:
        vmin = min(0.0, float(finite.min())) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    if vmax <= vmin:
        vmax = vmin + 1.0
    lang, family = drawn_lang(lang)
    xlabel, ylabel = label(xlabel, lang, labels), label(ylabel, lang, labels)

    fig = _new_figure(figsize, dpi, layout="constrained")  # room for labels and the colour bar
    axes = fig.subplots(num_rows, num_cols, sharex=True, sharey=True, squeeze=False)
    image = None
    for i in range(num_rows):
        for j in range(num_cols):
            ax = axes[i, j]
            image = ax.imshow(data[i, j], cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
            if i == num_rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel if row_titles is None else f"{label(row_titles[i], lang, labels)}\n{ylabel}")
            title = _panel_title(titles, i, j)
            if title is not None:
                ax.set_title(label(title, lang, labels), fontsize="medium")
            ax.tick_params(labelsize="small")
    # Shared axes: setting the ticks on one panel sets them on all; matplotlib labels the outer ones.
    if col_labels is not None:
        axes[0, 0].set_xticks(range(K), col_labels)
        for ax in axes[-1]:
            ax.tick_params(axis="x", labelrotation=90 if max(map(len, col_labels)) > 1 else 0)
    if row_labels is not None:
        axes[0, 0].set_yticks(range(Q), row_labels)
    fig.colorbar(image, ax=axes, shrink=0.6)
    if suptitle:
        fig.suptitle(label(suptitle, lang, labels))
    _use_font(fig, family)
    _save(fig, path)
    return fig


def _panel_title(titles, i, j):
    if not titles:
        return None
    t = titles[i] if isinstance(titles[0], (list, tuple)) else titles
    return None if t is None or j >= len(t) or t[j] is None else str(t[j])


# -- the attention of a trained model ------------------------------------------------------------
def _per_block(weights, index, what):
    """(num_blocks, num_heads, Q, K) weights of one example from either

    - a list of (batch, num_heads, Q, K) tensors, one per block (a model's
      ``attention_weights``): example ``index`` of each;
    - one (num_blocks, num_heads, Q, K) array or Tensor, already of one example (the
      ``attention`` of a decoded ``Hypothesis``, see ``minitensor.inference.decoding``)."""
    if weights is None or (isinstance(weights, (list, tuple)) and (not weights or any(w is None for w in weights))):
        raise ValueError(f"no {what} weights recorded: run the model forward (or decode) first")
    if not isinstance(weights, (list, tuple)):
        data = _to_numpy(weights)
        if data.ndim != 4:
            raise ValueError(f"{what} weights: expected (num_blocks, num_heads, Q, K), got shape {data.shape}")
        return data
    blocks = [_to_numpy(w) for w in weights]
    shapes = {b.shape for b in blocks}
    if any(b.ndim != 4 for b in blocks) or len(shapes) != 1:
        raise ValueError(
            f"{what} weights: expected one (batch, num_heads, Q, K) array per block, got shapes "
            f"{[b.shape for b in blocks]}"
        )
    return numpy.stack([b[index] for b in blocks])


def _heads_figure(weights, index, what, xlabel, ylabel, row_labels, col_labels, path, lang, labels, **kwargs):
    """A row of panels per block, a column per head: show_heatmaps with the titles in ``lang``
    (heads and blocks numbered from 1)."""
    data = _per_block(weights, index, what)
    num_blocks, num_heads = data.shape[:2]
    lang, _ = drawn_lang(lang)  # English titles when no font can draw the Chinese
    kwargs.setdefault("suptitle", what)
    return show_heatmaps(
        data,
        xlabel,
        ylabel,
        titles=[label("head {h}", lang, labels, h=h + 1) for h in range(num_heads)],
        path=path,
        row_titles=[label("block {b}", lang, labels, b=b + 1) for b in range(num_blocks)],
        row_labels=row_labels,
        col_labels=col_labels,
        lang=lang,
        labels=labels,
        **kwargs,
    )


def plot_encoder_attention(weights, src_tokens=None, path=None, index=0, lang="en", labels=None, **kwargs):
    """Encoder self-attention: each source token (a row) attending every source token.

    ``weights``: ``encoder.attention_weights`` after a forward pass -- a list of (batch,
    num_heads, T, T) tensors, one per block -- or one (num_blocks, num_heads, T, T) array of
    a single example. ``index``: which example of the batch (for a list). ``src_tokens``: its tokens
    (padding beyond them is cut off). One row of panels per block, one column per head;
    ``lang``, ``labels``: the language of the titles and axes ("en" or "zh") and labels of your
    own, as for ``show_heatmaps``; other ``kwargs`` go to ``show_heatmaps``. Returns the Figure."""
    return _heads_figure(
        weights,
        index,
        "encoder self-attention",
        "keys (source)",
        "queries (source)",
        src_tokens,
        src_tokens,
        path,
        lang,
        labels,
        **kwargs,
    )


def plot_decoder_self_attention(weights, tgt_tokens=None, path=None, index=0, lang="en", labels=None, **kwargs):
    """Decoder (causal) self-attention: each target position attending itself and the past
    -- a lower triangle.

    ``weights``: the first list of ``decoder.attention_weights`` (one (batch, num_heads, T, T)
    tensor per block) after a teacher-forced forward pass, or ``stack_decoding_steps(...)[0]``
    after decoding token by token. ``tgt_tokens``: the decoder's input tokens (``<bos>``
    and the tokens fed back), which are both the queries and the keys. Returns the Figure."""
    return _heads_figure(
        weights,
        index,
        "decoder self-attention",
        "keys (target)",
        "queries (target)",
        tgt_tokens,
        tgt_tokens,
        path,
        lang,
        labels,
        **kwargs,
    )


def plot_cross_attention(
    weights, src_tokens=None, tgt_tokens=None, path=None, index=0, lang="en", labels=None, **kwargs
):
    """Encoder-decoder attention: each target position (a row) attending the source tokens
    (the columns) -- where the alignment between input and output shows.

    ``weights``: the second list of ``decoder.attention_weights`` (one (batch, num_heads, T,
    S) tensor per block), or ``stack_decoding_steps(...)[1]``, or the (num_blocks, num_heads,
    L, S) array of one example such as ``Hypothesis.attention`` from ``beam_search(...,
    attention=True)`` (a row per generated token). Returns the Figure."""
    return _heads_figure(
        weights,
        index,
        "encoder-decoder attention",
        "keys (source)",
        "queries (target)",
        tgt_tokens,
        src_tokens,
        path,
        lang,
        labels,
        **kwargs,
    )


def stack_decoding_steps(steps):
    """Join the attention weights recorded at each step of token-by-token decoding into the
    weights of one pass over the whole output (D2L's ``dec_attention_weight_seq``).

    ``steps``: after each ``model.decode_step`` call, ``model.decoder.attention_weights`` --
    [self-attention per block, encoder-decoder attention per block], each (batch, num_heads,
    t_new, K). A step's self-attention sees only the keys so far; its missing future keys
    are filled with zeros (a causal map *is* zero there). Returns ([self per block],
    [cross per block] or Nones), as NumPy arrays (batch, num_heads, T, T) and (batch,
    num_heads, T, S)."""
    if not steps:
        raise ValueError("stack_decoding_steps: no steps recorded")
    num_blocks = len(steps[0][0])
    self_blocks, cross_blocks = [], []
    for b in range(num_blocks):
        parts = [_to_numpy(step[0][b]) for step in steps]
        total = sum(p.shape[2] for p in parts)
        width = max(total, max(p.shape[3] for p in parts))
        self_blocks.append(
            numpy.concatenate([numpy.pad(p, [(0, 0), (0, 0), (0, 0), (0, width - p.shape[3])]) for p in parts], axis=2)
        )
        cross = [step[1][b] for step in steps]
        cross_blocks.append(
            None if any(c is None for c in cross) else numpy.concatenate([_to_numpy(c) for c in cross], axis=2)
        )
    return self_blocks, cross_blocks


def plot_transformer_attention(
    model,
    src_tokens=None,
    tgt_tokens=None,
    folder=".",
    prefix="attention",
    index=0,
    decoder_weights=None,
    lang="en",
    labels=None,
    **kwargs,
):
    """Draw the three kinds of attention of an encoder-decoder Transformer, one PNG each:

        {folder}/{prefix}_encoder_self.png      encoder self-attention (source x source)
        {folder}/{prefix}_decoder_self.png      decoder causal self-attention (target x target)
        {folder}/{prefix}_cross.png             encoder-decoder attention (target x source)

    ``model``: an ``EncoderDecoder`` of a ``TransformerEncoder`` and ``TransformerDecoder``,
    right after a forward pass (``model(enc_X, dec_X, enc_valid_lens)``), so that its layers
    hold the weights. After token-by-token decoding instead, pass ``decoder_weights=
    stack_decoding_steps(recorded)`` (the decoder only remembers its last step). ``index``
    picks the batch example; ``src_tokens`` / ``tgt_tokens`` label its axes. ``lang``: "en" or
    "zh", the language of the titles and axes (编码器自注意力, 头 1, 键（源序列）...: see
    ``show_heatmaps``); ``labels``: labels of your own. Returns
    ``{"encoder_self": Figure, "decoder_self": Figure, "cross": Figure}``; ``folder=None``
    writes nothing."""
    dec_self, cross = decoder_weights if decoder_weights is not None else model.decoder.attention_weights
    figures = {}
    for key, draw, args in (
        ("encoder_self", plot_encoder_attention, (model.encoder.attention_weights, src_tokens)),
        ("decoder_self", plot_decoder_self_attention, (dec_self, tgt_tokens)),
        ("cross", plot_cross_attention, (cross, src_tokens, tgt_tokens)),
    ):
        path = None if folder is None else os.path.join(os.fspath(folder), f"{prefix}_{key}.png")
        figures[key] = draw(*args, path=path, index=index, lang=lang, labels=labels, **kwargs)
    return figures


def plot_seq2seq_attention(
    weights, src_tokens=None, tgt_tokens=None, path=None, index=0, lang="en", labels=None, **kwargs
):
    """The attention of a Bahdanau decoder (GRU + additive attention, D2L 11.4): one map,
    a row per output step, a column per source position.

    ``weights``: ``decoder.attention_weights`` -- one (batch, 1, S) tensor per step of the last
    call (the whole target with teacher forcing), or the list of those lists gathered after
    each step of token-by-token decoding; or the (L, S) array of one example, such as
    ``Hypothesis.attention`` from ``beam_search(..., attention=True)``. ``lang``, ``labels``: as
    for ``show_heatmaps``. Returns the Figure."""
    kwargs.setdefault("suptitle", "Bahdanau attention")
    if weights is not None and not isinstance(weights, (list, tuple)):
        data = _to_numpy(weights)
        if data.ndim != 2:
            raise ValueError(
                f"Bahdanau attention weights: expected a list of steps or one (L, S) array, got shape {data.shape}"
            )
    else:
        steps = list(weights or [])
        if steps and isinstance(steps[0], (list, tuple)):  # one list per decoding call
            steps = [w for call in steps for w in call]
        if not steps:
            raise ValueError("no Bahdanau attention weights recorded: run the decoder first")
        data = numpy.concatenate([_to_numpy(w)[index] for w in steps], axis=0)  # (T, S)
    return show_heatmaps(
        data,
        "keys (source)",
        "queries (target)",
        path=path,
        row_labels=tgt_tokens,
        col_labels=src_tokens,
        lang=lang,
        labels=labels,
        **kwargs,
    )
