"""Pictures (minitensor/train/plots.py): loss curves and attention heatmaps as PNG files.

Valid PNGs of the expected size, one panel per (row, column) with one shared colour bar,
token labels on the axes, the three kinds of Transformer attention (and Bahdanau's),
decoding step by step giving the same maps as one forward pass, atomic writes, and
matplotlib staying optional: never imported by ``import minitensor``, a clear error
naming ``pip install matplotlib`` when it is missing.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import minitensor as mt
from minitensor import nn

pytest.importorskip("matplotlib")
import matplotlib.image  # noqa: E402

from minitensor.train import plots  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
V = 13  # vocabulary size of the small models


def read_png(path, fig=None):
    """Check ``path`` is a PNG that matplotlib reads back, of the figure's size in pixels."""
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    if fig is not None:
        width, height = fig.get_size_inches() * fig.dpi
        assert abs(image.shape[1] - width) <= 2 and abs(image.shape[0] - height) <= 2
    return image


def heatmap_axes(fig):
    """The panels of a heatmap figure (the colour bar's axes hold no image)."""
    return [ax for ax in fig.axes if ax.images]


def ticks(labels):
    return [t.get_text() for t in labels]


def seq2seq(num_blks=2, num_heads=2, num_hiddens=8, seed=0):
    mt.manual_seed(seed)
    args = (V, num_hiddens, 2 * num_hiddens, num_heads, num_blks, 0.0)
    model = nn.EncoderDecoder(
        nn.TransformerEncoder(*args, dtype=mt.float64), nn.TransformerDecoder(*args, dtype=mt.float64)
    )
    return model.eval()


def token_ids(batch, steps, seed=0):
    return mt.tensor(np.random.default_rng([seed, batch, steps]).integers(0, V, (batch, steps)))


# -- show_heatmaps ------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,cols", [(1, 1), (2, 3), (3, 2)])
def test_heatmaps_png_with_one_panel_per_matrix_and_one_colorbar(tmp_path, rows, cols):
    weights = mt.softmax(mt.randn(rows, cols, 4, 6), axis=-1)
    path = tmp_path / "maps.png"
    fig = plots.show_heatmaps(weights, "keys", "queries", path=path)
    read_png(path, fig)
    panels = heatmap_axes(fig)
    assert len(panels) == rows * cols
    assert len(fig.axes) == rows * cols + 1  # + the shared colour bar
    assert all(ax.images[0].get_array().shape == (4, 6) for ax in panels)
    # one colour scale for all panels, from 0 to the largest weight
    for ax in panels:
        assert ax.images[0].get_clim() == (0.0, pytest.approx(weights.numpy().max()))
    assert panels[-1].get_xlabel() == "keys" and panels[0].get_ylabel() == "queries"


def test_heatmaps_d2l_call_with_titles_and_cmap():
    # d2l.show_heatmaps(attention_weights.reshape((1, 1, 1, 10)), xlabel="Keys", ylabel="Queries")
    fig = plots.show_heatmaps(np.eye(10).reshape(1, 1, 10, 10), xlabel="Keys", ylabel="Queries")
    assert len(heatmap_axes(fig)) == 1
    fig = plots.show_heatmaps(np.ones((2, 3, 2, 2)), "k", "q", titles=["a", "b", "c"], cmap="viridis")
    panels = heatmap_axes(fig)
    assert [ax.get_title() for ax in panels] == ["a", "b", "c"] * 2  # titles: one per column (D2L)
    assert panels[0].images[0].get_cmap().name == "viridis"


def test_heatmaps_accept_a_single_matrix_and_lists():
    assert len(heatmap_axes(plots.show_heatmaps([[0.2, 0.8], [1.0, 0.0]], "k", "q"))) == 1
    assert len(heatmap_axes(plots.show_heatmaps([mt.ones(2, 3), mt.zeros(2, 3)], "k", "q"))) == 2


def test_heatmaps_of_a_tensor_on_any_device(device):
    weights = mt.softmax(mt.randn(1, 2, 3, 3, device=device), axis=-1)
    fig = plots.show_heatmaps(weights, "k", "q")
    np.testing.assert_allclose(heatmap_axes(fig)[1].images[0].get_array(), weights.numpy()[0, 1])


def test_token_labels_on_the_axes_and_padding_cut_off(tmp_path):
    queries, keys = ["<bos>", "b", "a"], list("abc") + ["<eos>"]
    matrices = np.random.default_rng(0).random((2, 2, 5, 7))  # 2 query and 3 key positions of padding
    fig = plots.show_heatmaps(
        matrices, "keys", "queries", row_labels=queries, col_labels=keys, path=tmp_path / "tokens.png"
    )
    read_png(tmp_path / "tokens.png", fig)
    panels = heatmap_axes(fig)  # row by row; shared axes: the outer panels carry the labels
    for ax in panels[2:]:
        assert ticks(ax.get_xticklabels()) == keys
    for ax in panels[::2]:
        assert ticks(ax.get_yticklabels()) == queries
    for ax in panels:
        assert ax.images[0].get_array().shape == (3, 4)
    # a string is a sequence of character tokens
    fig = plots.show_heatmaps(matrices, "k", "q", row_labels="xyz", col_labels="2021-05")
    assert ticks(heatmap_axes(fig)[-1].get_xticklabels()) == list("2021-05")


def test_more_labels_than_positions_is_an_error():
    with pytest.raises(ValueError, match="col_labels"):
        plots.show_heatmaps(np.ones((1, 1, 2, 2)), "k", "q", col_labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="shape"):
        plots.show_heatmaps(np.ones((1, 1, 1, 2, 2)), "k", "q")


# -- plot_loss -----------------------------------------------------------------------------------
def test_loss_plot_of_training_losses_only(tmp_path):
    path = tmp_path / "loss.png"
    fig = plots.plot_loss([3.0, 2.0, 1.5, float("nan"), 1.0], path)
    read_png(path, fig)
    assert len(fig.axes) == 1  # no second axis without evaluation metrics
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3, 5])  # the NaN step is left out
    np.testing.assert_array_equal(line.get_ydata(), [3.0, 2.0, 1.5, 1.0])
    assert fig.axes[0].get_xlabel() == "step"


def test_loss_plot_with_eval_metrics_per_epoch(tmp_path):
    history = {
        "loss": list(np.linspace(3.0, 0.5, 100)),  # 4 epochs of 25 steps
        "eval": [{"epoch": e, "accuracy": 0.2 * e, "loss": 2.0 / e, "bleu": 0.1 * e} for e in range(1, 5)],
    }
    path = tmp_path / "loss.png"
    fig = plots.plot_loss(history, path, smooth=0.9, title="date task")
    read_png(path, fig)
    left, right = fig.axes
    labels = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    # losses on the left axis, other metrics on the right one, at the end of each epoch
    assert {line.get_label() for line in left.get_lines()} >= {"training loss (EMA 0.9)", "eval loss"}
    assert {line.get_label() for line in right.get_lines()} == {"eval accuracy", "eval bleu"}
    np.testing.assert_allclose(labels["eval accuracy"].get_xdata(), [25, 50, 75, 100])
    np.testing.assert_allclose(labels["eval accuracy"].get_ydata(), [0.2, 0.4, 0.6, 0.8])
    assert right.get_ylim() == (0.0, 1.02)
    legend = ticks(left.get_legend().get_texts())
    assert "eval accuracy" in legend and "training loss (EMA 0.9)" in legend
    assert left.get_title() == "date task"


def test_loss_plot_smoothing_is_a_debiased_moving_average():
    fig = plots.plot_loss([1.0, 0.0, 0.0], smooth=0.5)
    raw, smoothed = fig.axes[0].get_lines()
    np.testing.assert_array_equal(raw.get_ydata(), [1.0, 0.0, 0.0])
    # s = 0.5, 0.25, 0.125 over (1 - 0.5^t) = 0.5, 0.75, 0.875
    np.testing.assert_allclose(smoothed.get_ydata(), [1.0, 1 / 3, 1 / 7])


def test_loss_plot_history_forms():
    # records with their own steps, metrics chosen by name, eval as a dict of lists
    history = {
        "train": [{"step": 10, "loss": 2.0}, {"step": 20, "loss": 1.0}],
        "eval": {"epoch": [1, 2], "step": [10, 20], "accuracy": [0.5, 0.9], "exact_match": [0.1, 0.2]},
    }
    fig = plots.plot_loss(history, metrics=["accuracy"])
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    assert set(lines) == {"training loss", "eval accuracy"}
    np.testing.assert_array_equal(lines["training loss"].get_xdata(), [10, 20])
    np.testing.assert_array_equal(lines["eval accuracy"].get_xdata(), [10, 20])
    # (step, loss) pairs, and an object with attributes
    fig = plots.plot_loss({"loss": [(5, 1.0), (6, 0.5)], "steps_per_epoch": 3, "eval": [{"epoch": 2, "acc": 1}]})
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    np.testing.assert_array_equal(lines["eval acc"].get_xdata(), [6])

    class History:
        train_loss = [1.0, 0.5]
        eval = [{"epoch": 1, "accuracy": 0.7}]

    assert len(plots.plot_loss(History()).axes) == 2
    # evaluations only: drawn per epoch
    fig = plots.plot_loss({"eval": [{"epoch": 1, "accuracy": 0.5}, {"epoch": 2, "accuracy": 0.6}]})
    assert fig.axes[0].get_xlabel() == "epoch"


def test_loss_plot_errors():
    with pytest.raises(ValueError, match="no training loss"):
        plots.plot_loss({"loss": []})
    with pytest.raises(ValueError, match="smooth"):
        plots.plot_loss([1.0, 2.0], smooth=1.0)


# -- the three kinds of Transformer attention --------------------------------------------------
def test_transformer_attention_three_figures_rows_blocks_cols_heads(tmp_path):
    model = seq2seq(num_blks=2, num_heads=3, num_hiddens=12)
    enc_X, dec_X = token_ids(2, 6, seed=1), token_ids(2, 5, seed=2)
    model(enc_X, dec_X, mt.tensor([6, 4]))
    src, tgt = ["a", "b", "c", "<eos>"], ["<bos>", "x", "y", "z", "w"]  # example 1: 4 valid source tokens
    figs = plots.plot_transformer_attention(model, src, tgt, folder=tmp_path, prefix="run", index=1)
    assert sorted(os.listdir(tmp_path)) == ["run_cross.png", "run_decoder_self.png", "run_encoder_self.png"]
    expected = {"encoder_self": (src, src), "decoder_self": (tgt, tgt), "cross": (tgt, src)}
    for key, fig in figs.items():
        read_png(tmp_path / f"run_{key}.png", fig)
        panels = heatmap_axes(fig)
        assert len(panels) == 2 * 3
        assert [ax.get_title() for ax in panels] == ["head 1", "head 2", "head 3"] * 2
        assert panels[0].get_ylabel().startswith("block 1") and panels[3].get_ylabel().startswith("block 2")
        rows, cols = expected[key]
        assert ticks(panels[0].get_yticklabels()) == rows and ticks(panels[-1].get_xticklabels()) == cols
    # the panels hold the weights of example 1, block b, head h
    enc = model.encoder.attention_weights
    np.testing.assert_allclose(
        heatmap_axes(figs["encoder_self"])[4].images[0].get_array(), enc[1].numpy()[1, 1, :4, :4]
    )
    cross = model.decoder.attention_weights[1]
    np.testing.assert_allclose(heatmap_axes(figs["cross"])[2].images[0].get_array(), cross[0].numpy()[1, 2, :, :4])
    dec_self = heatmap_axes(figs["decoder_self"])[0].images[0].get_array()
    assert np.allclose(np.triu(dec_self, 1), 0)  # causal: a lower triangle


def test_each_kind_on_its_own(tmp_path):
    model = seq2seq()
    model(token_ids(1, 4), token_ids(1, 3), None)
    fig = plots.plot_encoder_attention(model.encoder.attention_weights, "abcd", tmp_path / "enc.png")
    read_png(tmp_path / "enc.png", fig)
    assert len(heatmap_axes(fig)) == 4 and fig.get_suptitle() == "encoder self-attention"
    fig = plots.plot_decoder_self_attention(model.decoder.attention_weights[0], cmap="Blues")
    assert len(heatmap_axes(fig)) == 4
    fig = plots.plot_cross_attention(model.decoder.attention_weights[1], src_tokens="abcd", tgt_tokens="xyz")
    assert ticks(heatmap_axes(fig)[-1].get_xticklabels()) == list("abcd")
    with pytest.raises(ValueError, match="forward"):
        plots.plot_encoder_attention(seq2seq().encoder.attention_weights)


def test_weights_of_one_example_as_a_single_array():
    # the layout of a decoded Hypothesis.attention: (num_blks, num_heads, L, K), no batch axis
    weights = np.random.default_rng(0).random((3, 2, 4, 5))
    fig = plots.plot_cross_attention(weights, src_tokens="abcde", tgt_tokens="wxyz")
    panels = heatmap_axes(fig)
    assert len(panels) == 3 * 2
    np.testing.assert_allclose(panels[5].images[0].get_array(), weights[2, 1])
    fig = plots.plot_encoder_attention(mt.tensor(weights[:, :, :4, :4]))
    assert len(heatmap_axes(fig)) == 6
    with pytest.raises(ValueError, match="num_blocks, num_heads"):
        plots.plot_cross_attention(weights[0])
    # Bahdanau: (L, K)
    fig = plots.plot_seq2seq_attention(weights[0, 0], src_tokens="abcde", tgt_tokens="wxyz")
    np.testing.assert_allclose(heatmap_axes(fig)[0].images[0].get_array(), weights[0, 0])


def test_decoding_step_by_step_gives_the_maps_of_one_forward_pass():
    model = seq2seq()
    enc_X, dec_X = token_ids(2, 5, seed=3), token_ids(2, 4, seed=4)
    valid_lens = mt.tensor([5, 3])
    model(enc_X, dec_X, valid_lens)
    full_self, full_cross = model.decoder.attention_weights
    state, recorded = model.begin_decoding(enc_X, valid_lens), []
    for t in range(4):
        _, state = model.decode_step(dec_X[:, t : t + 1], state)
        recorded.append(model.decoder.attention_weights)
    dec_self, cross = plots.stack_decoding_steps(recorded)
    for b in range(2):
        np.testing.assert_allclose(dec_self[b], full_self[b].numpy(), atol=1e-12)
        np.testing.assert_allclose(cross[b], full_cross[b].numpy(), atol=1e-12)
    figs = plots.plot_transformer_attention(model, "abcde", "wxyz", folder=None, decoder_weights=(dec_self, cross))
    assert all(len(heatmap_axes(fig)) == 4 for fig in figs.values())


def test_bahdanau_attention_map(tmp_path):
    mt.manual_seed(0)
    model = nn.Seq2Seq(nn.Seq2SeqEncoder(V, 4, 6, 1), nn.Seq2SeqAttentionDecoder(V, 4, 6, 1)).eval()
    enc_X, dec_X = token_ids(2, 5), token_ids(2, 3)
    model(enc_X, dec_X, mt.tensor([5, 2]))
    weights = model.decoder.attention_weights  # one (batch, 1, 5) per step
    fig = plots.plot_seq2seq_attention(
        weights, src_tokens=["a", "b"], tgt_tokens=["<bos>", "x", "y"], path=tmp_path / "bahdanau.png", index=1
    )
    read_png(tmp_path / "bahdanau.png", fig)
    (panel,) = heatmap_axes(fig)
    expected = np.concatenate([w.numpy()[1] for w in weights])[:, :2]
    np.testing.assert_allclose(panel.images[0].get_array(), expected)
    np.testing.assert_allclose(expected.sum(axis=1), 1.0)  # source positions beyond 2 are padding
    # decoding one token per call: a list of per-call lists
    state, calls = model.begin_decoding(enc_X, mt.tensor([5, 2])), []
    for t in range(3):
        _, state = model.decode_step(dec_X[:, t : t + 1], state)
        calls.append(list(model.decoder.attention_weights))
    fig = plots.plot_seq2seq_attention(calls, "ab", ["<bos>", "x", "y"], index=1)
    np.testing.assert_allclose(heatmap_axes(fig)[0].images[0].get_array(), expected, atol=1e-6)


# -- files ---------------------------------------------------------------------------------------
def test_writes_are_atomic_and_leave_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "loss.png"  # missing folders are made
    plots.plot_loss([1.0, 0.5], path)
    before = path.read_bytes()
    plots.plot_loss([1.0, 0.5, 0.2], path)  # overwrite
    assert path.read_bytes() != before and os.listdir(path.parent) == ["loss.png"]
    before = path.read_bytes()

    import matplotlib.figure

    def broken(self, *args, **kwargs):
        args[0].write(b"half a PNG")
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        plots.plot_loss([1.0, 0.5, 0.1], path)
    assert path.read_bytes() == before  # the old picture, whole
    assert os.listdir(path.parent) == ["loss.png"]


# -- matplotlib is imported only when a figure is drawn ----------------------------------------
def test_import_minitensor_does_not_import_matplotlib():
    code = (
        "import sys, minitensor, minitensor.train, minitensor.train.plots\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
        "minitensor.train.plots.show_heatmaps([[1.0]], 'k', 'q')\n"
        "assert 'matplotlib' in sys.modules and 'matplotlib.pyplot' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_missing_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install matplotlib .*depends on it") as info:
        plots.plot_loss([1.0, 0.5], tmp_path / "loss.png")
    assert isinstance(info.value, ModuleNotFoundError) and info.value.name == "matplotlib"
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plots.show_heatmaps(np.ones((1, 1, 2, 2)), "k", "q", path=tmp_path / "maps.png")
    assert os.listdir(tmp_path) == []
