"""What a PyTorch program reaches for and minitensor has the same way: ``mt.topk``,
``mt.multinomial``, ``mt.tril``, ``mt.chunk``, ``mt.from_numpy``, ``x.contiguous()``,
``x.clone()``, ``x.dim()`` -- and a GPT written as nanoGPT writes one.

The last tests build one small GPT from one source, written against a ``torch`` namespace in
PyTorch's habits (fused q/k/v split by ``dim``, ``view``/``transpose``/``contiguous``, causal
``scaled_dot_product_attention``, ``ModuleDict``, tied weights, ``apply(init)``, optimiser
groups by ``p.dim()``, generation with ``topk``, a masked assignment, ``multinomial`` and
``cat``): with minitensor as ``torch`` it trains and generates; with PyTorch, where it is
installed, it gives the same loss and gradients from the same weights.
"""

import math

import minitensor.nn.functional as F
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.creation import MAX_SAMPLES
from minitensor.errors import AxisError, ShapeError
from strict_backend import count_syncs

import minitensor as mt


# -- topk ------------------------------------------------------------------------------------------
def _numpy_topk(a, k, axis, largest):
    order = np.argsort(-a if largest else a, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(a, indices, axis=axis), indices


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    data=st.data(),
    largest=st.booleans(),
)
def test_topk_matches_a_sort(shape, data, largest):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(0, shape[axis]))
    a = np.random.default_rng(len(shape) * 7 + k).permutation(math.prod(shape)).reshape(shape).astype(np.float32)
    values, indices = mt.topk(mt.tensor(a), k, axis=axis, largest=largest)
    want_values, want_indices = _numpy_topk(a, k, axis, largest)
    np.testing.assert_array_equal(values.numpy(), want_values)
    np.testing.assert_array_equal(indices.numpy(), want_indices)
    assert indices.dtype == np.int64 and not indices.requires_grad


def test_topk_on_every_device_with_its_gradient(device):
    a = np.random.default_rng(0).permutation(24).reshape(2, 3, 4).astype(np.float64)
    x = mt.tensor(a, device=device, requires_grad=True)
    for axis in (0, 1, -1):
        assert mt.gradcheck(lambda t: mt.topk(t, 2, axis=axis).values, [x])  # noqa: B023
        assert mt.gradcheck(lambda t: x.topk(1, dim=axis, largest=False).values * t, [x])  # noqa: B023
    x = mt.tensor(a, device=device, requires_grad=True)
    values, _ = mt.topk(x, 2)
    values.sum().backward()
    chosen = np.zeros_like(a)
    np.put_along_axis(chosen, _numpy_topk(a, 2, -1, True)[1], 1.0, axis=-1)
    np.testing.assert_array_equal(x.grad.numpy(), chosen)  # the k chosen get their gradient, the rest none


def test_topk_ties_come_in_position_order_and_nan_is_largest():
    x = mt.tensor([[1.0, 5.0, 5.0, 2.0], [3.0, float("nan"), 0.0, 3.0]])
    values, indices = x.topk(3)
    np.testing.assert_array_equal(indices.numpy(), [[1, 2, 3], [1, 0, 3]])
    assert np.isnan(values.numpy()[1, 0])
    np.testing.assert_array_equal(mt.topk(mt.tensor([2, 7, 7, -9]), 2).indices.numpy(), [1, 2])  # integers too
    assert mt.topk(mt.tensor([-(2**63), 0]), 1).values.item() == 0  # the smallest int64 does not overflow
    scalar = mt.topk(mt.tensor(3.0), 1)
    assert scalar.values.shape == scalar.indices.shape == () and scalar.values.item() == 3.0


def test_topk_refuses_what_it_cannot_take():
    x = mt.randn(2, 4)
    with pytest.raises(ValueError, match=r"topk: k must be an integer from 0 to 4 \(the length of axis 1\), got 5"):
        mt.topk(x, 5)
    for k in (-1, 1.0, True):
        with pytest.raises(ValueError, match="topk: k must be an integer"):
            mt.topk(x, k)
    with pytest.raises(AxisError, match="topk: axis 2 is out of bounds"):
        mt.topk(x, 1, dim=2)
    with pytest.raises(TypeError, match="topk: needs a tensor of numbers, got bool"):
        mt.topk(x > 0, 1)


def test_topk_agrees_with_pytorch():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(1).standard_normal((3, 5, 6)).astype(np.float32)
    for kwargs in ({"dim": 1}, {"dim": -1, "largest": False}, {"dim": 0}):
        ours, theirs = mt.topk(mt.tensor(a), 3, **kwargs), torch.topk(torch.tensor(a), 3, **kwargs)
        np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
        np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())  # (no ties in normal data)


# -- multinomial -----------------------------------------------------------------------------------
WEIGHTS = np.array([1.0, 2.0, 3.0, 0.0, 4.0])  # shares 0.1, 0.2, 0.3, 0, 0.4


def _within(counts, shares, n):
    """Each count within 5 standard deviations of n * share (a binomial's)."""
    sd = np.sqrt(n * shares * (1 - shares))
    return np.all(np.abs(counts - n * shares) <= 5 * sd + 1e-9), (counts, n * shares)


def test_multinomial_with_replacement_draws_each_category_by_its_weight(device):
    mt.manual_seed(0)
    n = 20_000
    draws = mt.multinomial(mt.tensor(WEIGHTS, device=device), n, replacement=True).numpy()
    assert draws.shape == (n,) and draws.dtype == np.int64
    counts = np.bincount(draws, minlength=5)
    assert counts[3] == 0  # a weight of 0 is never drawn
    ok, detail = _within(counts, WEIGHTS / WEIGHTS.sum(), n)
    assert ok, detail


def test_multinomial_without_replacement_draws_one_category_after_another(device):
    """Gumbel-top-k is drawing one at a time: the first draw goes by the weights, the second by
    the weights of those left, P(second = j) = sum_i p_i p_j / (1 - p_i)."""
    mt.manual_seed(1)
    rows = 20_000
    probs = mt.tensor(np.tile(WEIGHTS, (rows, 1)), device=device)
    draws = mt.multinomial(probs, 4).numpy()
    assert draws.shape == (rows, 4)
    assert all(sorted(row) == [0, 1, 2, 4] for row in draws[:500])  # never twice, never the zero weight
    p = WEIGHTS / WEIGHTS.sum()
    second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(5) if i != j) for j in range(5)])
    for column, shares in ((0, p), (1, second)):
        ok, detail = _within(np.bincount(draws[:, column], minlength=5), shares, rows)
        assert ok, (column, detail)


def test_multinomial_is_seeded_and_scale_free():
    for replacement in (False, True):
        mt.manual_seed(3)
        a = mt.multinomial(mt.tensor([[0.5, 1.0, 2.0], [4.0, 0.0, 1.0]]), 2, replacement=replacement)
        mt.manual_seed(3)
        b = mt.multinomial(mt.tensor([[1.5, 3.0, 6.0], [0.4, 0.0, 0.1]]), 2, replacement=replacement)
        assert a.shape == (2, 2)
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # the same shares, the same draws


@pytest.mark.parametrize(
    "weights, num_samples, replacement, message",
    [
        ([0.5, -0.1, 1.0], 1, True, "multinomial: probs holds -0.1; weights must be >= 0"),
        ([0.5, float("nan")], 1, True, "multinomial: probs holds nan; weights must be finite"),
        ([[1.0, 1.0], [0.0, float("inf")]], 1, False, "multinomial: row 1 holds inf; weights must be finite"),
        ([0.0, 0.0], 1, True, "probs has 0 categories of nonzero weight, fewer than the 1 draw needs"),
        ([1.0, 0.0, 2.0], 3, False, "probs has 2 categories of nonzero weight, fewer than the 3 different draws"),
    ],
)
def test_multinomial_refuses_bad_weights_on_every_device(device, weights, num_samples, replacement, message):
    probs = mt.tensor(weights, device=device)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):  # on a device: at the next read
        mt.multinomial(probs, num_samples, replacement=replacement).numpy()


def test_multinomial_refuses_bad_calls():
    probs = mt.tensor([0.2, 0.8])
    for bad in (0, -1, 2.0, True, MAX_SAMPLES + 1):
        with pytest.raises(ValueError, match="multinomial: num_samples must be an integer from 1 to"):
            mt.multinomial(probs, bad, replacement=True)
    with pytest.raises(ValueError, match="3 different categories cannot be drawn from 2 without replacement"):
        mt.multinomial(probs, 3)
    with pytest.raises(ShapeError, match=r"got shape \(1, 1, 2\)"):
        mt.multinomial(probs.reshape(1, 1, 2), 1)
    with pytest.raises(ShapeError, match="n >= 1"):
        mt.multinomial(mt.zeros(3, 0), 1)
    with pytest.raises(TypeError, match="must be floating point"):
        mt.multinomial(mt.tensor([1, 2]), 1)
    with pytest.raises(TypeError, match="must be a Tensor, got list"):
        mt.multinomial([0.5, 0.5], 1)


def test_multinomial_never_waits_for_the_device():
    probs = mt.tensor([[0.1, 0.9], [0.5, 0.5]], device="strict")
    with count_syncs() as log:
        mt.multinomial(probs, 2)
        mt.multinomial(probs, 5, replacement=True)
    assert not log.waits, log


# -- tril, triu ------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), diagonal=st.integers(-4, 4))
def test_tril_and_triu_keep_numpys_triangles(shape, diagonal):
    a = np.random.default_rng(diagonal + 5).standard_normal(shape)
    np.testing.assert_array_equal(mt.tril(mt.tensor(a), diagonal).numpy(), np.tril(a, diagonal))
    np.testing.assert_array_equal(mt.triu(mt.tensor(a), diagonal).numpy(), np.triu(a, diagonal))


def test_tril_and_triu_on_every_device_with_their_gradients(device):
    x = mt.tensor(np.random.default_rng(0).standard_normal((2, 3, 4)), device=device, requires_grad=True)
    for diagonal in (-1, 0, 2):
        assert mt.gradcheck(lambda t: mt.tril(t, diagonal) * t, [x])  # noqa: B023
        assert mt.gradcheck(lambda t: mt.triu(t, diagonal), [x])  # noqa: B023
    with pytest.raises(ShapeError, match=r"tril: needs a tensor of at least 2 dimensions \(matrices\), got shape"):
        mt.tril(mt.ones(3, device=device))
    with pytest.raises(TypeError, match="triu: diagonal must be an integer, got 1.5"):
        mt.triu(x, 1.5)


# -- chunk -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n, chunks, lengths",  # what torch.arange(n).chunk(chunks) gives (PyTorch 2.13)
    [(0, 3, [0, 0, 0]), (5, 3, [2, 2, 1]), (6, 3, [2, 2, 2]), (7, 4, [2, 2, 2, 1]), (2, 5, [1, 1]), (10, 1, [10])],
)
def test_chunk_cuts_pytorchs_pieces(n, chunks, lengths):
    pieces = mt.arange(n).chunk(chunks)
    assert [p.shape[0] for p in pieces] == lengths
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in pieces]), np.arange(n))


def test_chunk_splits_a_fused_projection_and_refuses_a_bad_count(device):
    x = mt.tensor(np.arange(12.0).reshape(2, 6), device=device, requires_grad=True)
    q, k, v = x.chunk(3, dim=-1)
    np.testing.assert_array_equal(k.numpy(), [[2.0, 3.0], [8.0, 9.0]])
    (q + 2 * k + 3 * v).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.tile([1.0, 1.0, 2.0, 2.0, 3.0, 3.0], (2, 1)))
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="chunk: chunks must be a positive integer"):
            mt.chunk(x, bad)
    with pytest.raises(ValueError, match="chunk: 1,000,000,000 empty pieces of an empty axis; at most 65,536"):
        mt.zeros(0, 3, device=device).chunk(10**9)  # a count the data does not bound


# -- contiguous, dim -------------------------------------------------------------------------------
def test_contiguous_is_the_tensor_itself_or_a_row_by_row_copy(device):
    x = mt.randn(3, 4, device=device, requires_grad=True)
    assert x.contiguous() is x and x.dim() == 2 and mt.tensor(1.0).dim() == 0
    t = x.transpose(0, 1)
    c = t.contiguous()
    assert c is not t and c.data.flags.c_contiguous and not t.data.flags.c_contiguous
    np.testing.assert_array_equal(c.numpy(), t.numpy())
    (c * mt.arange(12.0, device=device).reshape(4, 3)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.arange(12.0).reshape(4, 3).T)


def test_clone_copies_and_keeps_the_gradient_path(device):
    x = mt.tensor(np.arange(6.0).reshape(2, 3), device=device, requires_grad=True)
    assert mt.gradcheck(lambda t: t.transpose(0, 1).clone() * 3, [x])
    c = x.clone()
    assert c.grad_fn is not None and c.data is not x.data
    with mt.no_grad():
        c[0, 0] = 100.0  # a copy: x keeps its value
    assert x.numpy()[0, 0] == 0.0
    assert not x.clone().detach().requires_grad


def test_half_and_cuda_are_to_with_a_dtype_and_a_device(monkeypatch):
    from fake_cupy import fake_cuda_backend

    from minitensor import backends

    x = mt.randn(2, 3, requires_grad=True)
    h = x.half()
    assert h.dtype == np.float16 and h.half() is h
    h.float().sum().backward()
    assert x.grad.dtype == np.float32 and np.all(x.grad.numpy() == 1.0)
    layer = mt.nn.Linear(3, 2).half()
    assert layer.weight.dtype == np.float16 and layer(h).dtype == np.float16
    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())  # the CuPy stand-in
    on_gpu = x.cuda()
    assert on_gpu.device == "cuda" and on_gpu.cuda() is on_gpu and on_gpu.grad_fn is not None


def test_from_numpy_shares_memory_as_pytorchs_does():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    t = mt.from_numpy(a)
    a[0, 0] = 42
    assert t.device == "cpu" and t.dtype == np.int64 and t.numpy()[0, 0] == 42
    batch = mt.stack([mt.from_numpy(a[i]) for i in range(2)])  # nanoGPT's get_batch
    np.testing.assert_array_equal(batch.numpy(), a)
    with pytest.raises(TypeError, match="from_numpy: expected a numpy.ndarray, got list"):
        mt.from_numpy([1, 2])
    with pytest.raises(TypeError, match="from_numpy: unsupported dtype <U1"):
        mt.from_numpy(np.array(["a"]))
    with pytest.raises(TypeError, match=r"from_numpy: the array's byte order \(>f4\) is not this machine's"):
        mt.from_numpy(np.arange(3, dtype=">f4"))


def test_a_big_endian_array_becomes_a_tensor_in_this_machines_byte_order():
    """A ">f4" array (from a big-endian file) copied by ``mt.tensor`` is float32 like any other:
    it meets float32 tensors and rounds inside ``mt.autocast``."""
    t = mt.tensor(np.arange(4, dtype=">f4"))
    assert t.dtype == mt.float32 and t.dtype.isnative
    np.testing.assert_array_equal((t + mt.ones(4)).numpy(), [1, 2, 3, 4])
    with mt.autocast("cpu"):
        assert (t @ t).dtype == mt.bfloat16
    assert mt.tensor(np.arange(3, dtype=">i8")).dtype == mt.int64


def test_a_batch_is_cut_as_nanogpts_get_batch_cuts_it():
    """``torch.randint(high, size)`` and a tensor of one integer as a slice bound."""
    data = np.arange(1000, dtype=np.uint16)  # nanoGPT keeps its tokens as uint16
    block_size, batch_size = 8, 4
    mt.manual_seed(0)
    ix = mt.randint(len(data) - block_size, (batch_size,))
    x = mt.stack([mt.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
    y = mt.stack([mt.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix])
    starts = ix.numpy()
    assert x.shape == (4, 8) and ((0 <= starts) & (starts < len(data) - block_size)).all()
    np.testing.assert_array_equal(x.numpy(), starts[:, None] + np.arange(8))
    np.testing.assert_array_equal(y.numpy(), x.numpy() + 1)
    mt.manual_seed(0)
    np.testing.assert_array_equal(mt.randint(0, len(data) - block_size, (batch_size,)).numpy(), starts)
    assert list(range(mt.tensor(3))) == [0, 1, 2]
    for bad in (mt.tensor(1.0), mt.tensor([1, 2])):
        with pytest.raises(TypeError, match="only an integer tensor of one element can be an index"):
            data[bad:]


# -- a GPT in PyTorch's habits ---------------------------------------------------------------------
def gpt_of(torch, nn, F, vocab_size=17, block_size=12, n_layer=2, n_head=2, n_embd=16, flash=True):
    """A small GPT in the way nanoGPT's model.py writes one, for any ``torch``-like namespace;
    ``flash=False`` writes the attention matrix out, as nanoGPT does without SDPA."""

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
            self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
            if not flash:  # the causal mask, a buffer (not saved: the two paths share state dicts)
                mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
                self.register_buffer("bias", mask, persistent=False)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(n_embd, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            if flash:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(n_embd), SelfAttention()
            self.ln_2 = nn.LayerNorm(n_embd)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(
                dict(
                    wte=nn.Embedding(vocab_size, n_embd),
                    wpe=nn.Embedding(block_size, n_embd),
                    h=nn.ModuleList([Block() for _ in range(n_layer)]),
                    ln_f=nn.LayerNorm(n_embd),
                )
            )
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # tied
            self.apply(self._init_weights)

        def _init_weights(self, module):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                torch.nn.init.zeros_(module.bias)

        def forward(self, idx, targets=None):
            b, t = idx.size()
            pos = torch.arange(0, t, dtype=torch.long)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            if targets is None:
                return logits, None
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

        def configure_optimizers(self, weight_decay, lr):
            params = [p for p in self.parameters() if p.requires_grad]
            groups = [
                {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
            ]
            return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))

        @torch.no_grad()
        def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
            for _ in range(max_new_tokens):
                logits, _ = self(idx[:, -block_size:])
                logits = logits[:, -1, :] / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                probs = F.softmax(logits, dim=-1)
                idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
            return idx

    return GPT()


def _pattern_batch(rng, batch=8, T=12, vocab=17):
    """Windows of a repeating sequence 0, 1, ..., 16: the next token is always learnable."""
    starts = rng.integers(0, vocab, batch)
    windows = (starts[:, None] + np.arange(T + 1)) % vocab
    return windows[:, :-1], windows[:, 1:]


def test_a_gpt_written_in_pytorchs_habits_trains_and_generates_on_minitensor():
    mt.manual_seed(0)
    model = gpt_of(mt, mt.nn, F)
    optimizer = model.configure_optimizers(0.1, 1e-2)
    assert [len(g["params"]) for g in optimizer.param_groups] == [10, 14]  # tied: the embedding once
    rng, losses = np.random.default_rng(0), []
    for _ in range(60):
        X, Y = _pattern_batch(rng)
        _, loss = model(mt.tensor(X), mt.tensor(Y))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        mt.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 2.5 and np.mean(losses[-5:]) < 0.5, losses[::10]
    model.eval()
    out = model.generate(mt.tensor([[3, 4, 5]]), 8, top_k=3).numpy()[0]
    np.testing.assert_array_equal(out, (3 + np.arange(11)) % 17)  # it continues the pattern


def test_the_attention_matrix_written_out_gives_what_the_one_call_gives():
    flash, plain = gpt_of(mt, mt.nn, F), gpt_of(mt, mt.nn, F, flash=False)
    plain.load_state_dict(flash.state_dict())
    X, _ = _pattern_batch(np.random.default_rng(2))
    np.testing.assert_allclose(plain(mt.tensor(X))[0].numpy(), flash(mt.tensor(X))[0].numpy(), atol=1e-5)


@pytest.mark.parametrize("flash", [True, False])
def test_the_same_gpt_source_gives_pytorchs_loss_and_gradients(flash):
    torch = pytest.importorskip("torch")
    ours, theirs = gpt_of(mt, mt.nn, F, flash=flash), gpt_of(torch, torch.nn, torch.nn.functional, flash=flash)
    ours.to(mt.float64)
    theirs.double()
    state = {k: v.numpy() for k, v in ours.state_dict().items()}
    theirs.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    X, Y = _pattern_batch(np.random.default_rng(1))
    _, loss = ours(mt.tensor(X), mt.tensor(Y))
    _, loss_t = theirs(torch.tensor(X), torch.tensor(Y))
    loss.backward()
    loss_t.backward()
    assert abs(loss.item() - loss_t.item()) < 1e-12
    grads_t = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads_t[name].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
