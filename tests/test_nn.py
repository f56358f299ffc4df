"""Tests for ``mt.nn``: Module bookkeeping, state dicts, the basic layers and ``nn.init``.

Expected values are computed independently with NumPy (never with the code under test).
"""

import copy
import math
import warnings
from collections import OrderedDict

import numpy as np
import pytest
from minitensor.nn import functional as F

import minitensor as mt
from minitensor import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.register_buffer("steps", mt.zeros(1, dtype=mt.int64))
        self.register_buffer("cache", mt.zeros(d), persistent=False)

    def forward(self, X):
        return self.norm(X + self.dense(X).relu())


class Net(nn.Module):
    def __init__(self, vocab=7, d=4, num_classes=3):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(Block(d), Block(d))
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(d, num_classes)
        self.scale = nn.Parameter(mt.ones(1))

    def forward(self, tokens):
        return self.head(self.dropout(self.blocks(self.embedding(tokens)))) * self.scale


NET_PARAMS = [  # a module's own parameters come before its children's, as in PyTorch
    "scale",
    "embedding.weight",
    "blocks.0.dense.weight",
    "blocks.0.dense.bias",
    "blocks.0.norm.weight",
    "blocks.0.norm.bias",
    "blocks.1.dense.weight",
    "blocks.1.dense.bias",
    "blocks.1.norm.weight",
    "blocks.1.norm.bias",
    "head.weight",
    "head.bias",
]


def values(module):
    return {k: v.numpy() for k, v in module.state_dict().items()}


# -- Parameter ---------------------------------------------------------------------------------


def test_parameter_is_a_float_leaf_that_shares_a_tensors_data():
    t = mt.randn(2, 3)
    p = nn.Parameter(t)
    assert isinstance(p, mt.Tensor) and p.is_leaf and p.requires_grad
    assert p.data is t.data  # shares, as in PyTorch
    assert nn.Parameter([1.0, 2.0]).dtype == mt.float32
    assert not nn.Parameter(mt.ones(2), requires_grad=False).requires_grad
    assert type(p * 2) is mt.Tensor  # results of operations are plain tensors
    assert repr(p).startswith("Parameter containing:\ntensor(")
    with pytest.raises(TypeError, match="floating-point"):
        nn.Parameter(mt.tensor([1, 2]))


def test_parameter_from_a_non_leaf_is_cut_from_the_graph():
    x = mt.randn(3, requires_grad=True)
    p = nn.Parameter(x * 2)
    assert p.is_leaf and p.requires_grad
    (p * p).sum().backward()
    assert x.grad is None and p.grad is not None


# -- registration and naming ---------------------------------------------------------------------


def test_named_parameters_follow_registration_order_with_dotted_names():
    net = Net()
    assert [name for name, _ in net.named_parameters()] == NET_PARAMS
    assert [name for name, _ in net.named_children()] == ["embedding", "blocks", "dropout", "head"]
    assert [name for name, _ in net.named_modules()] == [
        "",
        "embedding",
        "blocks",
        "blocks.0",
        "blocks.0.dense",
        "blocks.0.norm",
        "blocks.1",
        "blocks.1.dense",
        "blocks.1.norm",
        "dropout",
        "head",
    ]
    assert [name for name, _ in net.named_buffers()] == [
        "blocks.0.steps",
        "blocks.0.cache",
        "blocks.1.steps",
        "blocks.1.cache",
    ]
    assert [n for n, _ in net.blocks[0].named_parameters(recurse=False)] == []
    assert [n for n, _ in net.named_parameters(recurse=False)] == ["scale"]
    assert net.head.weight is net.head._parameters["weight"]
    assert net.num_parameters() == 7 * 4 + 2 * (4 * 4 + 4 + 4 + 4) + 4 * 3 + 3 + 1


def test_shared_parameters_are_listed_once_but_saved_under_both_names():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(5, 3)
            self.output = nn.Linear(3, 5, bias=False)
            self.output.weight = self.embedding.weight  # weight tying: one parameter, two uses

    net = Tied()
    assert len(list(net.parameters())) == 1
    assert net.num_parameters() == 15
    assert list(net.state_dict()) == ["embedding.weight", "output.weight"]
    opt = mt.optim.SGD(net.parameters(), lr=0.1)
    assert len(opt.param_groups[0]["params"]) == 1

    shared = nn.Linear(2, 2)
    seq = nn.Sequential(shared, nn.ReLU(), shared)  # the same module twice
    assert len(list(seq.parameters())) == 2
    assert len(list(seq.modules())) == 3  # seq, the Linear once, ReLU


def test_buffers_are_state_but_not_parameters():
    block = Block(3)
    assert [n for n, _ in block.named_parameters()] == ["dense.weight", "dense.bias", "norm.weight", "norm.bias"]
    # own tensors (the persistent buffer) first, then the children's; no "cache"
    assert list(block.state_dict()) == ["steps", "dense.weight", "dense.bias", "norm.weight", "norm.bias"]
    block.steps = mt.ones(1, dtype=mt.int64)  # assigning a tensor to a buffer name updates the buffer
    assert block._buffers["steps"].item() == 1 and "steps" not in block.__dict__
    block.double()
    assert block.steps.dtype == mt.int64  # integer buffers keep their dtype
    assert block.cache.dtype == mt.float64 and block.dense.weight.dtype == mt.float64
    with pytest.raises(TypeError, match="Tensor or None"):
        block.steps = 3
    with pytest.raises(KeyError, match="already has an attribute"):
        block.register_buffer("dense", mt.zeros(1))


def test_assignment_errors_are_clear():
    lin = nn.Linear(2, 3)
    with pytest.raises(TypeError, match="Parameter or None"):
        lin.weight = mt.zeros(3, 2)
    assert isinstance(lin.weight, nn.Parameter)
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'wieght'"):
        lin.wieght  # noqa: B018

    class Forgetful(nn.Module):
        def __init__(self):
            self.dense = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Forgetful()
    with pytest.raises(NotImplementedError, match="no forward"):
        nn.Module()(mt.ones(1))


def test_reassigning_and_deleting_keep_one_meaning_per_name():
    m = nn.Module()
    m.a = nn.Parameter(mt.ones(2))
    m.b = nn.Linear(1, 1)
    m.a = nn.Linear(2, 2)  # a parameter name can become a module
    assert "a" not in m._parameters and m._modules["a"] is m.a
    assert list(m._modules) == ["b", "a"]
    m.b = nn.Linear(3, 3)  # replacing keeps its place
    assert list(m._modules) == ["b", "a"] and m.b.in_features == 3
    del m.a
    assert [n for n, _ in m.named_parameters()] == ["b.weight", "b.bias"]
    m.lin_bias = None  # plain attributes stay plain
    assert m.lin_bias is None and "lin_bias" in m.__dict__


def test_train_and_eval_reach_every_submodule():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.blocks.train()
    assert net.blocks[1].norm.training and not net.head.training and not net.training
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(TypeError):
        net.train("no")


def test_repr_is_nested_like_pytorch():
    net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Sequential(nn.Dropout(0.1), nn.LayerNorm(8)))
    assert repr(net) == (
        "Sequential(\n"
        "  (0): Linear(in_features=2, out_features=8, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Sequential(\n"
        "    (0): Dropout(p=0.1)\n"
        "    (1): LayerNorm((8,), eps=1e-05, elementwise_affine=True)\n"
        "  )\n"
        ")"
    )
    assert repr(nn.Embedding(10, 3, padding_idx=0)) == "Embedding(10, 3, padding_idx=0)"


def test_apply_zero_grad_and_requires_grad():
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "ReLU", "Linear", "Sequential"]  # children first, as in PyTorch
    net.apply(lambda m: nn.init.zeros_(m.bias) if isinstance(m, nn.Linear) else None)
    assert all(np.all(m.bias.numpy() == 0) for m in net if isinstance(m, nn.Linear))

    net(mt.randn(4, 3)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.numpy() == 0) for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.requires_grad_(False)
    assert net.num_parameters(trainable_only=True) == 0 and net.num_parameters() == 16


# -- state_dict / load_state_dict ----------------------------------------------------------------


def test_state_dict_round_trip_into_a_fresh_model_gives_identical_outputs():
    mt.manual_seed(0)
    a = Net()
    with mt.no_grad():
        a.blocks[0].norm.weight.copy_(mt.randn(4))  # make every tensor matter
    a.blocks[1].steps = mt.tensor([5])
    mt.manual_seed(1)
    b = Net()
    tokens = mt.tensor([[1, 2, 3], [4, 5, 6]])
    a.eval(), b.eval()
    assert not np.allclose(a(tokens).numpy(), b(tokens).numpy())

    sd = a.state_dict()
    assert list(sd) == NET_PARAMS[:2] + ["blocks.0.steps"] + NET_PARAMS[2:6] + ["blocks.1.steps"] + NET_PARAMS[6:]
    assert all(type(v) is mt.Tensor and not v.requires_grad for v in sd.values())
    weight = b.head.weight
    result = b.load_state_dict(sd)
    assert result == ([], []) and result.missing_keys == []
    assert b.head.weight is weight  # values are copied into the existing parameters
    np.testing.assert_array_equal(a(tokens).numpy(), b(tokens).numpy())
    assert b.blocks[1].steps.item() == 5


def test_load_state_dict_lists_missing_and_unexpected_keys_in_one_message():
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    sd = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)).state_dict()
    del sd["2.bias"]
    sd["3.weight"] = mt.zeros(1, 3)
    with pytest.raises(RuntimeError) as info:
        net.load_state_dict(sd)
    message = str(info.value)
    assert "missing key(s): '2.bias'" in message
    assert "unexpected key(s): '3.weight'" in message

    missing, unexpected = net.load_state_dict(sd, strict=False)
    assert (missing, unexpected) == (["2.bias"], ["3.weight"])
    np.testing.assert_array_equal(net[2].weight.numpy(), sd["2.weight"].numpy())


def test_load_state_dict_shape_mismatch_names_the_key_and_both_shapes():
    net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    sd = net.state_dict()
    sd["1.weight"] = mt.zeros(1, 4)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"shape mismatch for '1\.weight'.*\(1, 4\).*\(1, 3\)"):
            net.load_state_dict(sd, strict=strict)


def test_a_failed_load_changes_nothing():
    net = nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3), nn.Linear(3, 1))
    before = values(net)
    other = nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3), nn.Linear(3, 1))
    with mt.no_grad():
        for p in other.parameters():
            p.fill_(7.0)
    sd = other.state_dict()
    sd["2.bias"] = mt.zeros(5)  # the last key is bad; every key before it is fine
    with pytest.raises(RuntimeError, match="nothing was changed"):
        net.load_state_dict(sd)
    after = values(net)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_load_state_dict_accepts_numpy_arrays_and_converts_dtype():
    net = nn.Linear(3, 2)
    w = np.arange(6, dtype=np.float64).reshape(2, 3)
    net.load_state_dict({"weight": w, "bias": [0.5, -0.5]})
    assert net.weight.dtype == mt.float32 and net.bias.dtype == mt.float32
    np.testing.assert_array_equal(net.weight.numpy(), w.astype(np.float32))
    w[0, 0] = 100.0  # the model holds a copy
    assert net.weight.numpy()[0, 0] == 0
    with pytest.raises(RuntimeError, match=r"'bias'.*dtype"):
        net.load_state_dict({"weight": w, "bias": np.array(["a", "b"])})


def test_state_dict_shares_memory_as_documented():
    net = nn.Linear(2, 2)
    sd = net.state_dict()
    with mt.no_grad():
        net.weight.add_(1.0)
    np.testing.assert_array_equal(sd["weight"].numpy(), net.weight.numpy())


def test_deepcopy_gives_an_independent_working_model():
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    twin = copy.deepcopy(net)
    assert twin[0].weight is not net[0].weight and isinstance(twin[0].weight, nn.Parameter)
    x = mt.randn(4, 2)
    np.testing.assert_array_equal(twin(x).numpy(), net(x).numpy())


# -- dtypes and devices ------------------------------------------------------------------------


def test_a_plain_list_or_dict_of_new_layers_is_warned_about():
    """A classic slip: ``self.layers = [nn.Linear(...), ...]``. Neither parameters() nor state_dict()
    looks into a list, here as in PyTorch, so the layers would never train: a warning names the
    attribute and the container to use. A list of layers registered elsewhere is no slip."""

    class Layers(nn.Module):
        def __init__(self, wrap):
            super().__init__()
            self.blks = nn.ModuleList([nn.Linear(2, 2)])
            self.view = list(self.blks)  # registered already: no warning
            self.names, self.sizes = ["a"], {"a": 2}
            self.layers = wrap([nn.Linear(2, 2), nn.Tanh()])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(Layers(nn.ModuleList).parameters())) == 4
    for wrap, container in ((list, "ModuleList"), (tuple, "ModuleList"), (lambda m: dict(enumerate(m)), "ModuleDict")):
        with pytest.warns(UserWarning, match=rf"Layers.layers is a \w+ holding 2 module\(s\) .* mt.nn.{container}"):
            net = Layers(wrap)
        assert len(list(net.parameters())) == 2  # only blks': what the warning is about


def test_to_float64_keeps_parameter_identity_and_converts_grads():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    params = list(net.parameters())
    opt = mt.optim.SGD(net.parameters(), lr=0.1)
    net(mt.randn(5, 3)).sum().backward()
    before = [p.numpy() for p in params]
    assert net.to(mt.float64) is net
    assert all(a is b for a, b in zip(params, net.parameters()))
    assert all(p.dtype == mt.float64 and p.grad.dtype == mt.float64 for p in params)
    assert all(np.array_equal(b.astype(np.float64), p.numpy()) for b, p in zip(before, params))
    # The optimiser built before the conversion still trains the model.
    opt.zero_grad()
    net(mt.randn(5, 3, dtype=mt.float64)).sum().backward()
    opt.step()
    assert not np.array_equal(params[0].numpy(), before[0].astype(np.float64))
    net.float()
    assert all(p.dtype == mt.float32 for p in net.parameters())
    assert net.to(device="cpu") is net
    for integer in (mt.int64, "int32", mt.bool):  # parameters of integers that require grad: refused
        with pytest.raises(TypeError, match="Sequential.to: a module converts to a floating-point dtype"):
            net.to(integer)
    assert all(p.dtype == mt.float32 for p in net.parameters())


# -- Linear ------------------------------------------------------------------------------------


def test_linear_shapes_and_init_bounds():
    mt.manual_seed(0)
    lin = nn.Linear(400, 300)
    assert lin.weight.shape == (300, 400) and lin.bias.shape == (300,)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    k = 1 / math.sqrt(400)
    assert np.abs(w).max() <= k and np.abs(b).max() <= k
    # U(-k, k): mean 0, variance k^2/3, and it fills the whole interval.
    assert abs(w.mean()) < 0.01 * k
    assert abs(w.var() / (k**2 / 3) - 1) < 0.02
    assert np.abs(w).max() > 0.999 * k
    assert nn.Linear(3, 2, bias=False).bias is None
    assert [n for n, _ in nn.Linear(3, 2, bias=False).named_parameters()] == ["weight"]
    assert nn.Linear(3, 2, dtype=mt.float64).weight.dtype == mt.float64

    mt.manual_seed(5)
    first = nn.Linear(4, 3).weight.numpy()
    mt.manual_seed(5)
    np.testing.assert_array_equal(first, nn.Linear(4, 3).weight.numpy())


def test_linear_forward_equals_numpy():
    lin = nn.Linear(4, 3)
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    W, b = lin.weight.numpy(), lin.bias.numpy()
    expected = np.einsum("bti,oi->bto", x, W) + b
    np.testing.assert_allclose(lin(mt.tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.linear(mt.tensor(x), lin.weight).numpy(), expected - b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("in_features, out_features, batch", [(0, 3, (2, 5)), (4, 0, (6,)), (4, 3, (0, 2))])
def test_linear_with_an_axis_of_size_zero(in_features, out_features, batch):
    """As PyTorch: no input feature gives the bias (its gradient the number of rows), no output
    feature an empty result; forward and backward."""
    layer = nn.Linear(in_features, out_features)
    x = mt.randn(*batch, in_features, requires_grad=True)
    y = layer(x)
    assert y.shape == (*batch, out_features)
    if not in_features:
        np.testing.assert_array_equal(y.numpy(), np.broadcast_to(layer.bias.numpy(), y.shape))
    y.sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == layer.weight.shape
    np.testing.assert_array_equal(layer.bias.grad.numpy(), np.full(out_features, math.prod(batch), np.float32))


def test_gradcheck_through_linear_layernorm_embedding_and_a_small_model():
    mt.manual_seed(0)
    lin = nn.Linear(3, 2).double()
    x = mt.randn(4, 3, dtype=mt.float64, requires_grad=True)
    assert mt.gradcheck(lambda x, w, b: lin(x), [x, lin.weight, lin.bias])

    norm = nn.LayerNorm(5).double()
    with mt.no_grad():
        norm.weight.copy_(mt.randn(5, dtype=mt.float64))
        norm.bias.copy_(mt.randn(5, dtype=mt.float64))
    x = mt.randn(2, 3, 5, dtype=mt.float64, requires_grad=True)
    assert mt.gradcheck(lambda x, w, b: norm(x), [x, norm.weight, norm.bias])

    # The padding row's zero gradient is a rule, not a derivative (the look-up reads the row, as
    # in PyTorch), so finite differences would disagree there: gradcheck the rows that train.
    emb = nn.Embedding(6, 3, padding_idx=2).double()
    tokens = mt.tensor([[0, 4, 5], [5, 5, 1]])
    assert mt.gradcheck(lambda w: emb(tokens), [emb.weight])

    net = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2), nn.Sigmoid()).double()
    x = mt.randn(2, 3, dtype=mt.float64, requires_grad=True)
    assert mt.gradcheck(lambda x, *ps: net(x), [x, *net.parameters()])


# -- Embedding ---------------------------------------------------------------------------------


def test_embedding_init_lookup_and_padding():
    mt.manual_seed(0)
    emb = nn.Embedding(1000, 64)
    w = emb.weight.numpy()
    assert w.shape == (1000, 64)
    assert abs(w.mean()) < 0.01 and abs(w.std() - 1) < 0.01  # N(0, 1)
    tokens = mt.tensor([[3, 1], [3, 999]])
    np.testing.assert_array_equal(emb(tokens).numpy(), w[[[3, 1], [3, 999]]])
    np.testing.assert_array_equal(emb([[3, 1]]).numpy(), w[[[3, 1]]])  # lists are fine too

    emb = nn.Embedding(5, 3, padding_idx=-1)  # counts from the end, as in PyTorch
    assert emb.padding_idx == 4 and np.all(emb.weight.numpy()[4] == 0)
    tokens = mt.tensor([[4, 1, 4], [2, 4, 1]])
    out = emb(tokens)
    assert np.all(out.numpy()[tokens.numpy() == 4] == 0)  # the row holds zeros from init
    (out * mt.randn(2, 3, 3)).sum().backward()
    grad = emb.weight.grad.numpy()
    assert np.all(grad[4] == 0) and np.all(grad[[1, 2]] != 0) and np.all(grad[[0, 3]] == 0)
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(5, 3, padding_idx=5)


def test_embedding_from_pretrained():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    emb = nn.Embedding.from_pretrained(mt.tensor(table))
    assert not emb.weight.requires_grad
    np.testing.assert_array_equal(emb(mt.tensor([2, 0])).numpy(), table[[2, 0]])
    assert nn.Embedding.from_pretrained(table, freeze=False).weight.requires_grad


# -- LayerNorm, Dropout, activations -------------------------------------------------------------


def test_layernorm_matches_numpy_and_options():
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    norm = nn.LayerNorm(4)
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(norm(mt.tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-5)
    gamma, beta = np.array([1.0, -2.0, 0.5, 3.0], np.float32), np.array([0.1, 0.2, -0.3, 0.0], np.float32)
    norm.load_state_dict({"weight": gamma, "bias": beta})
    np.testing.assert_allclose(norm(mt.tensor(x)).numpy(), expected * gamma + beta, rtol=1e-4, atol=1e-5)
    assert [n for n, _ in nn.LayerNorm((3, 4)).named_parameters()] == ["weight", "bias"]
    assert nn.LayerNorm((3, 4)).weight.shape == (3, 4)
    assert list(nn.LayerNorm(4, elementwise_affine=False).parameters()) == []
    assert [n for n, _ in nn.LayerNorm(4, bias=False).named_parameters()] == ["weight"]


def test_dropout_drops_only_in_training():
    mt.manual_seed(0)
    drop = nn.Dropout(0.25)
    x = mt.ones(200, 100)
    y = drop(x).numpy()
    zeros = (y == 0).mean()
    assert 0.23 < zeros < 0.27
    np.testing.assert_allclose(y[y != 0], 1 / 0.75)
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), x.numpy())
    net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.9))
    net.eval()
    x = mt.randn(4, 3)
    np.testing.assert_array_equal(net(x).numpy(), net[0](x).numpy())
    with pytest.raises(ValueError, match="probability"):
        nn.Dropout(1.5)


def test_activation_modules_match_their_functions():
    x = mt.randn(3, 5)
    pairs = [
        (nn.ReLU(), mt.relu),
        (nn.GELU(), mt.gelu),
        (nn.Tanh(), mt.tanh),
        (nn.Sigmoid(), mt.sigmoid),
        (nn.Softmax(axis=0), lambda t: mt.softmax(t, axis=0)),
        (nn.LogSoftmax(), mt.log_softmax),
        (nn.Identity(), lambda t: t),
    ]
    for module, fn in pairs:
        np.testing.assert_array_equal(module(x).numpy(), fn(x).numpy())
    xs = x.numpy()
    np.testing.assert_allclose(nn.ReLU()(x).numpy(), np.maximum(xs, 0))
    np.testing.assert_allclose(nn.Sigmoid()(x).numpy(), 1 / (1 + np.exp(-xs)), rtol=1e-6)
    assert F.relu is mt.relu and F.cross_entropy is mt.cross_entropy and F.masked_softmax is mt.masked_softmax


# -- containers --------------------------------------------------------------------------------


def test_sequential_indexing_slicing_and_names():
    net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    assert len(net) == 3 and isinstance(net[1], nn.ReLU) and net[-1] is net[2]
    assert list(net) == [net[0], net[1], net[2]]
    head = net[1:]
    assert isinstance(head, nn.Sequential) and len(head) == 2 and head[1] is net[2]
    x = mt.randn(5, 2)
    np.testing.assert_array_equal(net(x).numpy(), net[2](net[1](net[0](x))).numpy())

    named = nn.Sequential(OrderedDict(hidden=nn.Linear(2, 4), act=nn.ReLU(), out=nn.Linear(4, 1)))
    assert [n for n, _ in named.named_parameters()] == ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
    assert named.hidden is named[0]
    named.append(nn.Sigmoid())
    assert list(named._modules) == ["hidden", "act", "out", "3"]


def test_module_list_and_dict_register_their_elements():
    blocks = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(blocks) == 3 and len(list(blocks.parameters())) == 6
    blocks.append(nn.Linear(2, 2))
    replacement = nn.Linear(2, 2, bias=False)
    blocks[1] = replacement
    assert blocks[1] is replacement and list(blocks._modules) == ["0", "1", "2", "3"]
    assert [n for n, _ in blocks.named_parameters()][:3] == ["0.weight", "0.bias", "1.weight"]
    assert isinstance(blocks[:2], nn.ModuleList) and len(blocks[:2]) == 2

    heads = nn.ModuleDict({"cls": nn.Linear(4, 2), "reg": nn.Linear(4, 1)})
    assert "cls" in heads and len(heads) == 2 and list(heads) == ["cls", "reg"]
    assert [n for n, _ in heads.named_parameters()] == ["cls.weight", "cls.bias", "reg.weight", "reg.bias"]
    del heads["reg"]
    assert list(heads.keys()) == ["cls"]


# -- nn.init -----------------------------------------------------------------------------------


def test_init_functions():
    mt.manual_seed(0)
    w = mt.zeros(200, 300, requires_grad=True)  # works although w requires grad: under no_grad
    b = math.sqrt(6 / (200 + 300))
    nn.init.xavier_uniform_(w)
    assert np.abs(w.numpy()).max() <= b and np.abs(w.numpy()).max() > 0.99 * b
    nn.init.kaiming_uniform_(w, nonlinearity="relu")
    b = math.sqrt(2) * math.sqrt(3 / 300)
    assert np.abs(w.numpy()).max() <= b and np.abs(w.numpy()).max() > 0.99 * b
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # PyTorch Linear's bound 1/sqrt(fan_in)
    assert abs(np.abs(w.numpy()).max() - 1 / math.sqrt(300)) < 1e-3
    nn.init.normal_(w, mean=2.0, std=0.5)
    assert abs(w.numpy().mean() - 2) < 0.01 and abs(w.numpy().std() - 0.5) < 0.01
    nn.init.uniform_(w, -3, -2)
    assert w.numpy().min() >= -3 and w.numpy().max() <= -2
    assert np.all(nn.init.zeros_(w).numpy() == 0) and np.all(nn.init.ones_(w).numpy() == 1)
    assert nn.init.fan_in_and_fan_out(mt.zeros(8, 4, 3)) == (12, 24)
    with pytest.raises(ValueError, match="at least 2 axes"):
        nn.init.xavier_uniform_(mt.zeros(3))
    with pytest.raises(TypeError, match="floating-point"):
        nn.init.normal_(mt.zeros(3, dtype=mt.int64))
    # what PyTorch refuses too, and what made every weight NaN
    nn.init.ones_(w)
    for call, said in [
        (lambda: nn.init.normal_(w, 0.0, -1.0), "normal_: std must be >= 0, got -1.0"),
        (lambda: nn.init.normal_(w, 0.0, math.nan), "normal_: std must be a finite number, got nan"),
        (lambda: nn.init.uniform_(w, 1.0, -1.0), r"uniform_: the range \[a, b\) is empty, a=1.0 > b=-1.0"),
        (lambda: nn.init.uniform_(w, -math.inf, 0.0), "uniform_: a must be a finite number"),
        (lambda: nn.init.constant_(w, "a"), "constant_: value must be a number, got 'a'"),
        (lambda: nn.init.constant_(w, math.nan), "constant_: value must be a number, got nan"),
    ]:
        with pytest.raises(ValueError, match=said):
            call()
    assert np.all(w.numpy() == 1)  # each was refused before it changed anything
    assert np.all(nn.init.constant_(w, -math.inf).numpy() == -math.inf)  # a mask's fill


# -- forward hooks (PyTorch's semantics) -------------------------------------------------------------
def test_forward_hooks_see_and_may_replace_inputs_and_outputs():
    layer = mt.nn.Linear(3, 2)
    x = mt.randn(4, 3)
    plain = layer(x).numpy()
    calls = []
    pre = layer.register_forward_pre_hook(lambda m, args: calls.append(("pre", m, args[0].shape)))
    post = layer.register_forward_hook(lambda m, args, out: calls.append(("post", args[0].shape, out.shape)))
    np.testing.assert_array_equal(layer(x).numpy(), plain)  # hooks returning None change nothing
    assert calls == [("pre", layer, (4, 3)), ("post", (4, 3), (4, 2))]
    doubled = layer.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    negated = layer.register_forward_hook(lambda m, args, out: -out)
    np.testing.assert_allclose(layer(x).numpy(), -layer.forward(x * 2).numpy(), rtol=1e-6)
    for handle in (pre, post, doubled, negated):
        handle.remove()
    handle.remove()  # twice is harmless
    calls.clear()
    np.testing.assert_array_equal(layer(x).numpy(), plain)
    assert calls == []


def test_forward_hooks_run_in_order_with_kwargs_and_as_a_context():
    class Scale(mt.nn.Module):
        def forward(self, x, factor=1.0):
            return x * factor

    layer, seen = Scale(), []
    layer.register_forward_hook(lambda m, args, out: seen.append("first"))
    with layer.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs), with_kwargs=True):
        layer(mt.ones(2), factor=3.0)
    layer(mt.ones(2))
    assert seen == ["first", {"factor": 3.0}, "first"]
    with pytest.raises(TypeError, match="a hook must be callable, got int"):
        layer.register_forward_hook(3)
    assert "hook" not in " ".join(layer.state_dict())  # hooks are not state


@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf"), "1e-5", True])
def test_layer_norm_refuses_an_eps_that_is_not_a_finite_number_at_least_zero(eps):
    with pytest.raises(ValueError, match="LayerNorm: eps must be a finite number >= 0"):
        nn.LayerNorm(4, eps=eps)
    assert nn.LayerNorm(4, eps=0).eps == 0 and nn.LayerNorm(4, eps=np.float32(1e-6)).eps > 0  # NumPy's numbers too
