"""Export to ONNX (``mt.onnx``): the graphs pass onnx.checker and ONNX Runtime computes what
minitensor computes, at the traced sizes and at others (dynamic axes), with fully masked rows
at zeros; an op with no ONNX form is an error naming it; a Function can bring its own form;
``minitensor export`` + ``minitensor translate --onnx`` give minitensor's greedy translations."""

import json
import os
import subprocess
import sys

import numpy
import pytest
from minitensor.autograd import Function

import minitensor as mt


def _need(module):
    try:
        return __import__(module)
    except ImportError:
        message = f'{module} is not installed: pip install -e ".[onnx]"'
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true the ONNX tests must run (.ci/run installs the onnx extra): " + message)
        pytest.skip(message, allow_module_level=True)


onnx = _need("onnx")
ort = _need("onnxruntime")


def session(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options)


class SelfAttention(mt.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.attention = mt.nn.MultiHeadAttention(16, 4, dropout=0.0, **options)

    def forward(self, X, valid_lens):
        return self.attention(X, X, X, valid_lens=valid_lens, causal=True)


def test_attention_exports_with_dynamic_axes_and_zero_rows(tmp_path):
    mt.manual_seed(0)
    model = SelfAttention()
    path = tmp_path / "attention.onnx"
    mt.onnx.export(
        model,
        (mt.randn(2, 5, 16), mt.tensor([5, 2])),
        path,
        input_names=["X", "valid_lens"],
        output_names=["Y"],
        dynamic_axes={"X": {0: "batch", 1: "steps"}, "valid_lens": {0: "batch"}},
    )
    onnx.checker.check_model(onnx.load(path))
    run = session(path)
    rng = numpy.random.default_rng(0)
    for batch, steps in [(2, 5), (3, 9), (1, 1), (4, 2)]:
        X = mt.randn(batch, steps, 16)
        valid_lens = mt.tensor(rng.integers(0, steps + 1, batch))
        valid_lens.data[0] = 0  # a sequence with no valid position: every row fully masked
        with mt.no_grad():
            expected = model(X, valid_lens).numpy()
        (got,) = run.run(None, {"X": X.numpy(), "valid_lens": valid_lens.numpy()})
        assert not numpy.isnan(got).any()
        numpy.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_lengths_read_while_tracing_remember_where_they_came_from():
    x, W = mt.randn(2, 6), mt.randn(6, 3)
    with mt.onnx.tracing(x) as trace:  # x: an input of the traced pass
        batch, steps = x.shape
        half = steps // 2 + 1
        y = (x[:, :half] * 2).reshape(batch * half)
        assert isinstance(y.shape[0], mt.onnx.SymDim)  # a tensor made inside: lengths traced too
        assert all(type(n) is int for n in W.shape)  # made before, not an input: a constant of the graph
    assert isinstance(half, mt.onnx.SymDim) and half == 4
    kind, quotient, one = half.expr
    assert (kind, one) == ("add", 1) and quotient.expr[0] == "floordiv" and quotient.expr[1] is steps
    assert steps.expr[0] == "dim" and steps.expr[1] is x and steps.expr[2] == 1
    assert [n.name for n in trace.nodes] == ["GetItem", "Mul", "Reshape"]
    assert tuple(y.shape) == (8,)  # outside the trace: plain ints again
    assert type(y.shape[0]) is int and type(x.shape[0]) is int
    assert type(x) is type(y) is mt.Tensor


class Caching(mt.nn.Module):
    """Keeps what its last forward pass made (a decoder's cache, say) and compares inside."""

    def __init__(self):
        super().__init__()
        self.linear = mt.nn.Linear(4, 4)
        self.last = None

    def forward(self, X, valid_lens):
        positions = mt.arange(X.shape[1])
        mask = positions[None, :] < valid_lens[:, None]
        self.last = (self.linear(X), mask)
        return mt.where(mask[:, :, None], self.last[0], mt.zeros_like(self.last[0])), mask


def test_no_tensor_is_a_traced_tensor_after_export(tmp_path):
    """The exporter gives its tensors a class of its own while it traces (``TracedTensor``, whose
    shape remembers where the lengths come from) and gives them back ``Tensor`` when it is done:
    the model's state, its inputs, and the tensors the trace recorded."""
    model, X, valid_lens = Caching(), mt.randn(2, 5, 4), mt.tensor([5, 2])
    seen = []
    model.register_forward_hook(lambda module, inputs, outputs: seen.extend([*inputs, *outputs]))
    path = tmp_path / "caching.onnx"
    mt.onnx.export(model, (X, valid_lens), path, dynamic_axes={"input_0": [0, 1], "input_1": [0]})
    tensors = [X, valid_lens, *model.last, *seen, *model.parameters()]
    assert all(type(t) is mt.Tensor or isinstance(t, mt.nn.Parameter) for t in tensors)
    assert not any(isinstance(t, mt.onnx.TracedTensor) for t in tensors)
    assert all(type(n) is int for t in tensors for n in t.shape)
    X2, lens2 = mt.randn(3, 7, 4), mt.tensor([7, 1, 0])  # the comparison's mask follows the new lengths
    expected = [t.numpy() for t in model(X2, lens2)]
    got = session(path).run(None, {"input_0": X2.numpy(), "input_1": lens2.numpy()})
    numpy.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)
    assert (got[1] == expected[1]).all()


class Square(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved
        return 2 * a * grad


class SquareWithForm(Square):
    @staticmethod
    def to_onnx(g, node):
        a = g.value(node.args[0])
        return g.op("Mul", a, a)


class Apply(mt.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function.apply(x) + 1


def test_a_function_without_an_onnx_form_is_named_and_writes_nothing(tmp_path):
    path = tmp_path / "square.onnx"
    with pytest.raises(mt.onnx.ExportError, match=r"the op Square has no ONNX form: give the Function a static method"):
        mt.onnx.export(Apply(Square), (mt.randn(3),), path)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_a_function_can_bring_its_own_onnx_form(tmp_path):
    path = tmp_path / "square.onnx"
    mt.onnx.export(Apply(SquareWithForm), (mt.randn(3, 2),), path, dynamic_axes={"input_0": [0]})
    x = numpy.random.default_rng(1).normal(size=(5, 2)).astype(numpy.float32)
    (got,) = session(path).run(None, {"input_0": x})
    numpy.testing.assert_allclose(got, x * x + 1, rtol=1e-6)


def test_the_file_names_the_oldest_ir_version_of_its_opset_and_an_unknown_opset_is_refused(tmp_path):
    # not the onnx package's newest (14 for onnx 1.23), which ONNX Runtime 1.23, the last for
    # Python 3.10, refused to load: it reads IR 11 at most
    path = tmp_path / "linear.onnx"
    mt.onnx.export(mt.nn.Linear(2, 3), (mt.randn(4, 2),), path)
    assert onnx.load(path).ir_version == 8  # opset 17's
    mt.onnx.export(mt.nn.Linear(2, 3), (mt.randn(4, 2),), path, opset=21)
    assert onnx.load(path).ir_version == 10
    (got,) = session(path).run(None, {"input_0": numpy.ones((4, 2), numpy.float32)})
    assert got.shape == (4, 3)
    newest = onnx.defs.onnx_opset_version()
    unknown = rf"opset {newest + 1} is not one that the installed onnx .* up to {newest}"
    with pytest.raises(mt.onnx.ExportError, match=unknown):
        mt.onnx.export(mt.nn.Linear(2, 3), (mt.randn(4, 2),), tmp_path / "new.onnx", opset=newest + 1)
    assert not (tmp_path / "new.onnx").exists()
    with pytest.raises(TypeError, match="mt.onnx.export: module must be an mt.nn.Module, got function"):
        mt.onnx.export(lambda x: x * 2, (mt.randn(4, 2),), tmp_path / "f.onnx")


class Cosine(mt.nn.Module):
    """A user's scorer made of minitensor ops: it exports with no ONNX code of its own."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        q = queries / (queries * queries).sum(axis=-1, keepdims=True).sqrt()
        k = keys / (keys * keys).sum(axis=-1, keepdims=True).sqrt()
        return q @ k.swapaxes(-1, -2) * 5.0


@mt.hookimpl
def minitensor_scorers():
    return {"onnx_test_cosine": Cosine}


def test_a_plugin_made_of_ops_exports_with_no_extra_work(tmp_path):
    mt.plugins.register(sys.modules[__name__])
    try:
        mt.manual_seed(0)
        model = SelfAttention(scorer="onnx_test_cosine")
        path = tmp_path / "cosine.onnx"
        axes = {"X": {0: "batch", 1: "steps"}, "valid_lens": {0: "batch"}}
        mt.onnx.export(
            model, (mt.randn(2, 4, 16), mt.tensor([4, 3])), path, input_names=["X", "valid_lens"], dynamic_axes=axes
        )
        X, valid_lens = mt.randn(3, 7, 16), mt.tensor([7, 1, 4])
        with mt.no_grad():
            expected = model(X, valid_lens).numpy()
        (got,) = session(path).run(None, {"X": X.numpy(), "valid_lens": valid_lens.numpy()})
        numpy.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    finally:
        mt.plugins._reset()


class PyTorchHabits(mt.nn.Module):
    def forward(self, X):
        a = X.transpose(1, 2).contiguous()  # a copy (Clone), as nanoGPT writes it
        b = mt.tril(a, -1) + mt.triu(a, 2) + a  # no zeros left: no ties for topk
        values, indices = mt.topk(b, 2, dim=-1)
        return values * 2, indices


def test_contiguous_tril_triu_and_topk_export_and_agree(tmp_path):
    path = tmp_path / "habits.onnx"
    mt.manual_seed(0)
    mt.onnx.export(PyTorchHabits(), (mt.randn(2, 5, 4),), path, input_names=["X"], dynamic_axes={"X": {0: "batch"}})
    X = mt.randn(3, 5, 4)
    values, indices = PyTorchHabits()(X)
    got_values, got_indices = session(path).run(None, {"X": X.numpy()})
    numpy.testing.assert_allclose(got_values, values.numpy(), rtol=1e-6)
    numpy.testing.assert_array_equal(got_indices, indices.numpy())  # (random normal data: no ties)


class D2LHabits(mt.nn.Module):
    def forward(self, X):
        batch_size = X.shape[0]
        waves = X.sin() + mt.cos(X) * mt.eye(4)[1]
        tiled = mt.arange(1, 4).repeat(batch_size, 1)  # a traced count: the batch
        per_row = mt.repeat_interleave(waves, 2, dim=1)  # (batch, 6, 4)
        chosen = mt.repeat_interleave(waves, [0, 1, 2], dim=1)  # (batch, 3, 4)
        return per_row.sum(1) + chosen.sum(1), tiled


def test_sin_cos_eye_repeat_and_repeat_interleave_export_and_agree(tmp_path):
    path = tmp_path / "d2l.onnx"
    mt.onnx.export(D2LHabits(), (mt.randn(2, 3, 4),), path, input_names=["X"], dynamic_axes={"X": {0: "batch"}})
    X = mt.randn(5, 3, 4)
    values, tiled = D2LHabits()(X)
    got_values, got_tiled = session(path).run(None, {"X": X.numpy()})
    numpy.testing.assert_allclose(got_values, values.numpy(), rtol=1e-5, atol=1e-6)
    numpy.testing.assert_array_equal(got_tiled, tiled.numpy())  # five rows where the trace had two


class FloorAndRemainder(mt.nn.Module):
    def forward(self, X, N):
        return X // 1.5, X % -1.5, 2.0 % (X.abs() + 1), N // 3, N % -3, -7 // (N.abs() + 1)


def test_floor_divide_and_remainder_export_with_pythons_rounding(tmp_path):
    """ONNX's Div truncates integers toward zero, and its Mod keeps the divisor's sign for
    integers only: negative numbers show whether the graph rounds as Python's // and % do."""
    path = tmp_path / "floor.onnx"
    X, N = mt.tensor([[-4.0, -0.7, 0.0, 2.2, 5.9]]), mt.tensor([[-7, -3, -1, 0, 1, 5, 8]])
    mt.onnx.export(FloorAndRemainder(), (X, N), path, input_names=["X", "N"])
    got = session(path).run(None, {"X": X.numpy(), "N": N.numpy()})
    for value, expected in zip(got, FloorAndRemainder()(X, N), strict=True):
        assert value.dtype == expected.numpy().dtype
        numpy.testing.assert_allclose(value, expected.numpy(), rtol=1e-6, atol=1e-6)


def test_batch_norm_exports_with_its_running_statistics(tmp_path):
    """Exported in eval mode (export switches to it): the file normalises with the running
    statistics the training steps kept, whatever the batch, and the layer is back in training
    mode after the export."""
    model = mt.nn.Sequential(mt.nn.Linear(4, 3), mt.nn.BatchNorm1d(3), mt.nn.ReLU())
    for _ in range(3):
        model(mt.randn(8, 4) * 2 + 1)
    path = tmp_path / "bn.onnx"
    mt.onnx.export(model, (mt.randn(2, 4),), path, input_names=["X"], dynamic_axes={"X": {0: "batch"}})
    assert model.training
    X = mt.randn(1, 4)  # one example: a batch's own statistics would make every output 0
    got = session(path).run(None, {"X": X.numpy()})[0]
    numpy.testing.assert_allclose(got, model.eval()(X).numpy(), rtol=1e-5, atol=1e-6)
    assert got.any()


class Convolutions(mt.nn.Module):
    def __init__(self):
        super().__init__()
        self.image = mt.nn.Conv2d(1, 8, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))
        self.image_tap_by_tap = mt.nn.Conv2d(8, 3, kernel_size=3, padding=1)  # 8 channels: summed tap by tap
        self.sequence = mt.nn.Conv1d(8, 3, kernel_size=3, stride=2, padding=2, dilation=2, bias=False)
        self.sequence_im2col = mt.nn.Conv1d(3, 2, kernel_size=2)
        self.patches = mt.nn.LazyConv2d(5, kernel_size=4, stride=4)  # D2L 11.8's patch embedding

    def forward(self, X):
        Y = self.image(X).relu()  # (batch, 8, 4, 6)
        return (
            self.image_tap_by_tap(Y),
            self.sequence_im2col(self.sequence(Y.flatten(2))),
            self.patches(X).flatten(2).transpose(1, 2),
        )


def test_convolutions_export_and_agree(tmp_path):
    """Conv1d and Conv2d as ONNX's Conv, with unequal strides, padding and dilation along H and
    W, and a batch the trace did not have."""
    model = Convolutions()
    path = tmp_path / "conv.onnx"
    mt.onnx.export(model, (mt.randn(2, 1, 8, 8),), path, input_names=["X"], dynamic_axes={"X": {0: "batch"}})
    X = mt.randn(3, 1, 8, 8)
    for value, expected in zip(session(path).run(None, {"X": X.numpy()}), model(X), strict=True):
        numpy.testing.assert_allclose(value, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_the_books_masked_write_exports_and_other_writes_are_refused_not_lost(tmp_path):
    """Export runs under no_grad, where ``x[i] = v`` would write in place and record no op: the
    trace records it instead (the ops before the write keep the old value). D2L's sequence_mask
    write, a bool mask of the whole tensor and one value, exports as Where; others are refused,
    where before they were silently left out of the graph."""

    class Masks(mt.nn.Module):
        def forward(self, X, valid_lens):
            before = X * 2  # reads X before the write
            mask = mt.arange(X.shape[1])[None, :] < valid_lens[:, None]
            X[~mask] = -1e6  # the input itself, written
            return X.softmax(-1) + before

    path = tmp_path / "masks.onnx"
    axes = {"X": {0: "batch", 1: "steps"}, "valid_lens": {0: "batch"}}
    example = (mt.randn(2, 5), mt.tensor([5, 2]))
    mt.onnx.export(Masks(), example, path, input_names=["X", "valid_lens"], dynamic_axes=axes)
    X, valid_lens = mt.randn(3, 7), mt.tensor([7, 1, 4])
    (got,) = session(path).run(None, {"X": X.numpy(), "valid_lens": valid_lens.numpy()})
    numpy.testing.assert_allclose(got, Masks()(X.clone(), valid_lens).numpy(), rtol=1e-6, atol=1e-6)

    class Writes(mt.nn.Module):
        def forward(self, X):
            Y = X * 2
            Y[:, 0] = 0.0
            return Y

    with pytest.raises(mt.onnx.ExportError, match=r"x\[index\] = v exports where index is a bool mask .* mt.where"):
        mt.onnx.export(Writes(), (mt.randn(2, 3),), tmp_path / "writes.onnx")
    assert not (tmp_path / "writes.onnx").exists()


def test_the_books_transformer_encoder_exports_and_agrees(tmp_path):
    """D2L 11.7's encoder as the book writes it (tests/d2l_chapter.py: LazyLinear, masked_softmax
    with sequence_mask's write, repeat_interleave of the valid lengths by a traced length),
    exported with a dynamic batch and length, run by ONNX Runtime at other sizes."""
    from d2l_chapter import chapter_of

    mt.manual_seed(0)
    encoder = chapter_of(mt, mt.nn, mt.nn.functional)["TransformerEncoder"](20, 8, 16, 2, 2, 0.0)
    X, valid_lens = mt.randint(0, 20, (2, 5)), mt.tensor([5, 3])
    encoder(X, valid_lens)  # the lazy layers take their widths
    path = tmp_path / "encoder.onnx"
    axes = {"X": {0: "batch", 1: "steps"}, "valid_lens": {0: "batch"}}
    mt.onnx.export(encoder, (X, valid_lens), path, input_names=["X", "valid_lens"], dynamic_axes=axes)
    X, valid_lens = mt.randint(0, 20, (3, 9)), mt.tensor([9, 1, 4])
    (got,) = session(path).run(None, {"X": X.numpy(), "valid_lens": valid_lens.numpy()})
    encoder.eval()
    with mt.no_grad():
        numpy.testing.assert_allclose(got, encoder(X, valid_lens).numpy(), rtol=1e-4, atol=1e-5)


def test_export_needs_the_forward_to_return_tensors(tmp_path):
    class Pair(mt.nn.Module):
        def forward(self, x):
            return {"x": x}

    with pytest.raises(mt.onnx.ExportError, match="must return a Tensor or a tuple of Tensors"):
        mt.onnx.export(Pair(), (mt.randn(2),), tmp_path / "pair.onnx")
    with pytest.raises(mt.onnx.ExportError, match="dynamic_axes names"):
        mt.onnx.export(Apply(SquareWithForm), (mt.randn(2),), tmp_path / "x.onnx", dynamic_axes={"nope": [0]})


def test_streamed_attention_that_drops_its_weights_is_refused(tmp_path):
    """export() puts the model in eval mode, where a layer's dropout does nothing; a forward that
    asks flash_attention for dropout itself is refused, as the Dropout op is, and writes nothing."""
    from minitensor.ops.flash_attention import flash_attention

    class Dropping(mt.nn.Module):
        def forward(self, x):
            return flash_attention(x, x, x, causal=True, dropout_p=0.2)

    with pytest.raises(mt.onnx.ExportError, match=r"streamed attention dropped its weights \(dropout_p=0.2\)"):
        mt.onnx.export(Dropping(), (mt.randn(1, 2, 5, 4),), tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()

    class SelfAttention(mt.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = mt.nn.MultiHeadAttention(8, 2, dropout=0.3, fused=True)

        def forward(self, x):
            return self.layer(x, x, x, causal=True)

    model = SelfAttention()  # in training mode: export() evaluates it, and puts it back
    mt.onnx.export(model, (mt.randn(1, 5, 8),), tmp_path / "layer.onnx")
    assert model.training and (tmp_path / "layer.onnx").exists()


# -- the encoder-decoder as ONNX Runtime decodes it ---------------------------------------------------
def _train(tmp_path_factory, args):
    home = tmp_path_factory.mktemp("onnx_run")
    done = subprocess.run(
        [sys.executable, "-m", "minitensor", "train", *args, "--out", "run", "--no-progress"],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return home / "run", done.stdout


@pytest.fixture(scope="module")
def date_run(tmp_path_factory):
    """A date model trained to >= 95% held-out exact match, in about ten seconds."""
    run, log = _train(
        tmp_path_factory, ["--task", "date", "--num-train", "12000", "--num-heldout", "200", "--epochs", "4"]
    )
    accuracy = float(log.rsplit("held-out exact match ", 1)[1].split("%")[0])
    assert accuracy >= 95, log[-2000:]
    return run


def test_export_and_translate_onnx_give_minitensors_greedy_translations(date_run, tmp_path):
    from minitensor.inference.decoding import translate
    from minitensor.onnx.seq2seq import OnnxTranslator
    from minitensor.train.checkpoint import find_checkpoint
    from minitensor.train.config import build_data
    from minitensor.train.run import BEST_DIR, load_run_checkpoint

    folder = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, "-m", "minitensor", "export", "--checkpoint", str(date_run), "--onnx", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for name in ("encoder.onnx", "decoder_step.onnx"):
        onnx.checker.check_model(onnx.load(folder / name))
    assert json.loads((folder / "vocab.json").read_text())["tokens"] == "char"

    config, info = load_run_checkpoint(find_checkpoint(date_run, BEST_DIR))
    data = build_data(config)
    from minitensor.cli import _load_for_inference

    model, *_ = _load_for_inference(str(date_run))
    sources = [list(s) for s, _ in data.heldout[:200]]
    expected = [
        h.tokens
        for h in translate(model, sources, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps)
    ]
    got = OnnxTranslator(folder).translate(sources, max_len=data.tgt_num_steps)
    assert got == expected
    references = [list(t) for _, t in data.heldout[:200]]
    assert sum(g == r for g, r in zip(got, references)) >= 190  # the model is good: the comparison means something

    shown = subprocess.run(
        [sys.executable, "-m", "minitensor", "translate", "--onnx", str(folder), "3 May 2021"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0 and shown.stdout.strip() == "2021-05-03", shown.stderr


def test_translate_onnx_wrong_inputs_are_one_line_errors(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "minitensor", "translate", "--onnx", str(tmp_path), "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no exported model here" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "minitensor", "translate", "x"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "one of the arguments --checkpoint --onnx is required" in done.stderr


# -- every built-in part, the LM and the Bahdanau model: ONNX Runtime = minitensor to 1e-5 ----------
def _fresh(model="transformer", **options):
    from minitensor.train.config import TrainConfig, build_data, build_model

    config = TrainConfig(
        task="reverse",
        model=model,
        num_train=64,
        num_heldout=12,
        max_len=7,
        num_hiddens=16,
        ffn_num_hiddens=32,
        num_blks=2,
        **options,
    )
    mt.manual_seed(0)
    data = build_data(config)
    built = build_model(config, data.src_vocab, data.tgt_vocab)
    built.eval()
    return built, data


def _seq2seq_parity(model, data, folder, steps=4):
    """Largest |ORT - minitensor| over the encoder and ``steps`` decoder steps (state fed back),
    for sources longer than the traced ones; and ORT's greedy translations equal minitensor's."""
    from minitensor.data import build_array
    from minitensor.inference.decoding import translate
    from minitensor.onnx.seq2seq import OnnxTranslator, export_encoder_decoder

    paths = export_encoder_decoder(model, folder, data.src_vocab, data.tgt_vocab, data.num_steps, data.tgt_num_steps)
    encoder, decoder = session(paths[0]), session(paths[1])
    sources = [list(s) for s, _ in data.heldout[:5]]
    X, valid_lens = build_array(sources, data.src_vocab, data.num_steps + 3)
    X, valid_lens = X.astype(numpy.int64), valid_lens.astype(numpy.int64)
    worst = 0.0
    with mt.no_grad():
        state = model.begin_decoding(mt.tensor(X), mt.tensor(valid_lens))
        encoded = dict(
            zip([o.name for o in encoder.get_outputs()], encoder.run(None, {"src": X, "src_valid_lens": valid_lens}))
        )
        worst = max(worst, float(numpy.abs(encoded["enc_outputs"] - state[0].numpy()).max()))
        feed = {}
        for i in decoder.get_inputs()[3:]:
            feed[i.name] = encoded.get(i.name)
            if feed[i.name] is None:  # a key/value cache: empty at the first step
                feed[i.name] = numpy.zeros((len(X), i.shape[1], 0, i.shape[3]), numpy.float32)
        tokens = numpy.full((len(X), 1), data.tgt_vocab.bos, dtype=numpy.int64)
        for _ in range(steps):
            logits, state = model.decode_step(mt.tensor(tokens), state)
            got, *new = decoder.run(
                None, {"tokens": tokens, "enc_outputs": encoded["enc_outputs"], "src_valid_lens": valid_lens, **feed}
            )
            worst = max(worst, float(numpy.abs(got - logits.numpy()).max()))
            feed = dict(zip(feed, new))
            tokens = logits.numpy()[:, -1].argmax(-1)[:, None].astype(numpy.int64)
    expected = [
        h.tokens
        for h in translate(model, sources, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps)
    ]
    assert OnnxTranslator(folder).translate(sources, max_len=data.tgt_num_steps) == expected
    return worst


PARTS = [
    ("scorer", s)
    for s in ("dot", "scaled_dot", "additive", "cosine", "gaussian", "l2", "kernel", "parametric_gaussian")
]
PARTS += [("pooling", p) for p in ("softmax", "average", "sparsemax", "entmax15", "alpha_entmax")]
PARTS += [
    ("positional", p) for p in ("sinusoidal", "learned", "none", "rotary", "alibi", "t5_relative", "sliding_window")
]


@pytest.mark.parametrize("part", PARTS, ids=[f"{kind}={name}" for kind, name in PARTS])
def test_every_built_in_part_exports_and_agrees(part, tmp_path):
    model, data = _fresh(**{part[0]: part[1]})
    worst = _seq2seq_parity(model, data, tmp_path / "exported")
    print(f"{part[0]}={part[1]}: largest difference {worst:.1e}")
    assert worst <= 1e-5


def test_the_bahdanau_model_exports_and_agrees(tmp_path):
    model, data = _fresh("bahdanau")
    worst = _seq2seq_parity(model, data, tmp_path / "exported")
    print(f"bahdanau: largest difference {worst:.1e}")
    assert worst <= 1e-5


def test_the_language_model_exports_with_dynamic_batch_and_window(tmp_path):
    from minitensor.onnx.lm import export_language_model
    from minitensor.train.config import TrainConfig, build_data, build_model

    text = os.path.join(os.path.dirname(mt.__file__), "data", "texts", "time_machine.txt")
    config = TrainConfig.recipe(
        "lm",
        text=text,
        max_examples=5000,
        num_hiddens=16,
        ffn_num_hiddens=32,
        num_blks=2,
        positional="rotary",
        lm_num_steps=16,
    )
    mt.manual_seed(0)
    data = build_data(config)
    model = build_model(config, data.src_vocab, data.tgt_vocab)
    model.eval()
    paths = export_language_model(model, tmp_path / "lm", data.tgt_vocab, config.lm_num_steps)
    run = session(paths[0])
    name = run.get_inputs()[0].name
    rng = numpy.random.default_rng(0)
    for batch, steps in [(1, 1), (2, 16), (3, 40)]:
        tokens = rng.integers(0, len(data.tgt_vocab), (batch, steps)).astype(numpy.int64)
        with mt.no_grad():
            expected = model(mt.tensor(tokens)).numpy()
        (got,) = run.run(None, {name: tokens})
        numpy.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
