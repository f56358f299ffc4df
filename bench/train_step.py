"""A whole Transformer training step (forward + loss + backward + Adam): minitensor vs PyTorch.

What is measured
----------------
One optimiser step of the encoder-decoder Transformer of D2L 11.7 on a batch of random
token sequences, teacher forcing, the loss masked to each target's valid length:

    optimizer.zero_grad()
    logits = model(enc_X, dec_X, enc_valid_lens)                # (batch, T, tgt_vocab)
    loss = cross_entropy(logits, Y, padding masked out)         # mean over valid tokens
    loss.backward()
    optimizer.step()                                            # Adam, lr 1e-3

at two sizes:

- ``d2l``: D2L's configuration (num_hiddens 32, 2 + 2 blocks, 4 heads, ffn_num_hiddens 64,
  dropout 0.2, batch 128, num_steps 10). Every array is small (a 32 x 32 weight, 1280 x 32
  activations), so each op costs tens of microseconds and the fixed per-op costs --
  Python and graph bookkeeping in minitensor, the dispatcher and autograd engine in
  PyTorch -- weigh far more than at the larger size. (``--profile`` puts numbers on it: the
  same step at batch 1, where arithmetic is nil, takes ~20% of the batch-128 step in both
  libraries, so most of the time still goes to the NumPy / ATen work on small arrays.)
  Target: minitensor <= 0.6x PyTorch.
- ``large``: num_hiddens 256, 8 heads, ffn_num_hiddens 1024, 4 + 4 blocks, batch 64,
  64 tokens (~190 GFLOP per step). Mostly BLAS. Targets: minitensor <= 1.0x PyTorch
  (stretch 0.9x); going from 1 to 2 threads speeds minitensor's backward up >= 1.6x, as
  PyTorch's (the elementwise work runs in numba kernels on every thread, not in NumPy on
  one); Adam's step <= 1.0x PyTorch's (its default, ``foreach``) Adam.

Both use the vocabulary sizes of minitensor's date task (62 source, 15 target tokens, with
<pad> = 0 and <bos> = 1). The batches are random: tokens uniform over the non-reserved ones,
valid lengths uniform in [2, T], padding after them; eight batches are cycled through.

The PyTorch twin is written here to match ``mt.nn.EncoderDecoder`` layer for layer: the
post-LN blocks (AddNorm = LayerNorm(dropout(Y) + X)), embeddings * sqrt(d) plus the
sinusoidal table, dropout after them, ``torch.nn.MultiheadAttention(bias=False,
batch_first=True)`` (its fused scaled-dot-product path: need_weights=False), dropout on the
attention weights, a causal self-attention and a cross-attention in each decoder block, the
FFN dense2(relu(dense1(x))) and a final Linear to the target vocabulary. The loss is the
mean cross-entropy over valid target tokens (minitensor: ``mask=``; PyTorch:
``ignore_index=<pad>``, its fused form of the same). Before timing, the script checks that
both have the same number of parameters and that, with minitensor's weights copied into
the twin and dropout off, they give the same loss and the same gradients.

Method: as in the other scripts (``_common.py``) -- interleaved rounds after a warm-up, the
same thread count for NumPy's BLAS, numba and PyTorch, at 1 and 2 threads, medians with
half the IQR. Each sample is one step, split into forward (with the loss), backward and
optimiser (zero_grad + step). ``--quick`` runs only the D2L configuration, with few rounds.

At 2 threads both libraries use thread pools whose every parallel region waits for all
its threads: on a machine where other processes keep a core busy those waits cost
milliseconds, so read the 2-thread rows only from an idle machine (the script says when the
load average is up).

``--profile`` adds where minitensor's D2L-configuration step goes (at 1 thread): op counts
(Function.apply calls, graph nodes) against PyTorch's aten calls (``torch.profiler``), the
time inside each kind of op's forward and backward against the Python around them, the
same step at batch 1 (the fixed per-op cost of each library), a cProfile by own time and
PyTorch's profile by self CPU time.

    python bench/train_step.py [--quick] [--profile] [--config d2l|large|all]
"""

import argparse
import functools
import math
import os
import time
from dataclasses import dataclass, replace

import numpy as np
from _common import (
    THREAD_COUNTS,
    format_ratio,
    format_stats,
    format_time,
    import_torch,
    interleaved,
    limit_threads,
    print_header,
    print_table,
    verdict,
)

# The date task's vocabularies (minitensor.data.tasks.date_task): 62 source characters, 15
# target ones, reserved tokens first.
SRC_VOCAB, TGT_VOCAB = 62, 15
PAD, BOS, EOS, NUM_RESERVED = 0, 1, 2, 4
LR = 1e-3
NUM_BATCHES = 8  # distinct batches, cycled through


@dataclass(frozen=True)
class Config:
    name: str
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    num_blks: int  # encoder blocks = decoder blocks
    dropout: float
    batch_size: int
    num_steps: int
    target: float  # the largest acceptable minitensor / torch step-time ratio
    rounds: int
    warmup: int

    def describe(self):
        return (
            f"num_hiddens {self.num_hiddens}, ffn {self.ffn_num_hiddens}, {self.num_heads} heads, "
            f"{self.num_blks} + {self.num_blks} blocks, dropout {self.dropout}, batch {self.batch_size}, "
            f"{self.num_steps} tokens"
        )


CONFIGS = {
    "d2l": Config("d2l", 32, 64, 4, 2, 0.2, 128, 10, target=0.6, rounds=30, warmup=5),
    "large": Config("large", 256, 1024, 8, 4, 0.2, 64, 64, target=1.0, rounds=5, warmup=1),
}
QUICK_ROUNDS, QUICK_WARMUP = 8, 2


# -- data ------------------------------------------------------------------------------------
def make_batches(cfg, n=NUM_BATCHES, seed=0):
    """``n`` random batches as NumPy arrays: a dict with enc_X, enc_valid_lens (batch, T) /
    (batch,), dec_X (the target shifted right behind <bos>), Y (the target, <pad> after its
    valid length) and mask (True on Y's valid positions)."""
    rng = np.random.default_rng(seed)
    B, T = cfg.batch_size, cfg.num_steps
    positions = np.arange(T)
    batches = []
    for _ in range(n):
        enc_valid_lens = rng.integers(2, T + 1, size=B)
        enc_X = rng.integers(NUM_RESERVED, SRC_VOCAB, size=(B, T))
        enc_X[positions >= enc_valid_lens[:, None]] = PAD
        y_valid_lens = rng.integers(2, T + 1, size=B)
        Y = rng.integers(NUM_RESERVED, TGT_VOCAB, size=(B, T))
        Y[np.arange(B), y_valid_lens - 1] = EOS
        mask = positions < y_valid_lens[:, None]
        Y[~mask] = PAD
        dec_X = np.concatenate([np.full((B, 1), BOS), Y[:, :-1]], axis=1)
        batches.append({"enc_X": enc_X, "enc_valid_lens": enc_valid_lens, "dec_X": dec_X, "Y": Y, "mask": mask})
    return batches


# -- minitensor --------------------------------------------------------------------------------
def build_minitensor(cfg, seed=0):
    """``mt.nn.EncoderDecoder`` with D2L's Transformer encoder and decoder, and its Adam."""
    import minitensor as mt

    mt.manual_seed(seed)
    args = (cfg.num_hiddens, cfg.ffn_num_hiddens, cfg.num_heads, cfg.num_blks, cfg.dropout)
    model = mt.nn.EncoderDecoder(mt.nn.TransformerEncoder(SRC_VOCAB, *args), mt.nn.TransformerDecoder(TGT_VOCAB, *args))
    model.train()
    return model, mt.optim.Adam(model.parameters(), lr=LR)


# Two small models whose steps run every kernel variant once: minitensor's numba kernels
# come as a serial and a parallel version (for arrays of PARALLEL_MIN_SIZE = 32768 elements
# or more), each loaded on first use; the second model's attention weights have 65,536.
WARM_UP_CONFIGS = (
    Config("tiny", 8, 16, 2, 1, 0.2, 4, 4, target=0, rounds=0, warmup=0),
    Config("tiny-wide", 8, 16, 2, 1, 0.2, 128, 16, target=0, rounds=0, warmup=0),
)


def load_minitensor_kernels():
    """A step of each warm-up model: numba and minitensor's kernels load on first use, and
    ``limit_threads`` can only set numba's thread count once numba is imported."""
    for cfg in WARM_UP_CONFIGS:
        model, opt = build_minitensor(cfg)
        minitensor_step(model, opt, minitensor_batches(make_batches(cfg, n=1))[0])


def minitensor_batches(batches):
    import minitensor as mt

    return [{k: mt.tensor(v) for k, v in b.items()} for b in batches]


def timed_step(optimizer, compute_loss):
    """One training step, either library; returns (loss, phase durations in seconds)."""
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = compute_loss()
    middle = time.perf_counter()
    loss.backward()
    after_backward = time.perf_counter()
    optimizer.step()
    end = time.perf_counter()
    return loss, {
        "forward": middle - start,
        "backward": after_backward - middle,
        "optimizer": end - after_backward,
        "total": end - start,
    }


def minitensor_step(model, optimizer, batch):
    import minitensor as mt

    def compute_loss():
        logits = model(batch["enc_X"], batch["dec_X"], batch["enc_valid_lens"])
        return mt.cross_entropy(logits, batch["Y"], mask=batch["mask"])

    return timed_step(optimizer, compute_loss)


def minitensor_state(model):
    """The parameters as NumPy arrays, by minitensor's names."""
    return {name: p.numpy() for name, p in model.named_parameters()}


def minitensor_grads(model):
    return {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


# -- the PyTorch twin ---------------------------------------------------------------------------
@functools.cache
def torch_model_class(torch):
    """The PyTorch encoder-decoder, module for module and name for name minitensor's (the
    attention layers aside: ``in_proj_weight`` = [W_q; W_k; W_v], ``out_proj`` = W_o)."""
    nn, F = torch.nn, torch.nn.functional

    def sinusoidal_table(max_len, d):
        # minitensor_plugins.positional.SinusoidalEncoding: P[i, 2j] = sin(i w_j), P[i, 2j+1] = cos(i w_j)
        positions = np.arange(max_len, dtype=np.float64)[:, None]
        angles = positions / np.power(10000.0, np.arange(0, d, 2, dtype=np.float64) / d)
        P = np.empty((max_len, d))
        P[:, 0::2] = np.sin(angles)
        P[:, 1::2] = np.cos(angles[:, : d // 2])
        return torch.tensor(P, dtype=torch.float32)

    class TransformerEmbedding(nn.Module):
        def __init__(self, vocab_size, d, dropout, max_len=1000):
            super().__init__()
            self.num_hiddens = d
            self.token_embedding = nn.Embedding(vocab_size, d)
            nn.init.normal_(self.token_embedding.weight, 0.0, d**-0.5)
            self.register_buffer("P", sinusoidal_table(max_len, d), persistent=False)
            self.dropout = nn.Dropout(dropout)

        def forward(self, tokens):
            X = self.token_embedding(tokens) * math.sqrt(self.num_hiddens)
            return self.dropout(X + self.P[: tokens.shape[1]])

    class AddNorm(nn.Module):  # post-LN
        def __init__(self, d, dropout):
            super().__init__()
            self.dropout = nn.Dropout(dropout)
            self.ln = nn.LayerNorm(d)

        def forward(self, X, Y):
            return self.ln(self.dropout(Y) + X)

    class PositionWiseFFN(nn.Module):
        def __init__(self, d, ffn_num_hiddens):
            super().__init__()
            self.dense1 = nn.Linear(d, ffn_num_hiddens)
            self.dense2 = nn.Linear(ffn_num_hiddens, d)

        def forward(self, X):
            return self.dense2(F.relu(self.dense1(X)))

    def attention(d, num_heads, dropout):
        return nn.MultiheadAttention(d, num_heads, dropout=dropout, bias=False, batch_first=True)

    class EncoderBlock(nn.Module):
        def __init__(self, d, ffn_num_hiddens, num_heads, dropout):
            super().__init__()
            self.attention = attention(d, num_heads, dropout)
            self.addnorm1 = AddNorm(d, dropout)
            self.ffn = PositionWiseFFN(d, ffn_num_hiddens)
            self.addnorm2 = AddNorm(d, dropout)

        def forward(self, X, key_padding_mask):
            Y = self.addnorm1(X, self.attention(X, X, X, key_padding_mask=key_padding_mask, need_weights=False)[0])
            return self.addnorm2(Y, self.ffn(Y))

    class DecoderBlock(nn.Module):
        def __init__(self, d, ffn_num_hiddens, num_heads, dropout):
            super().__init__()
            self.attention1 = attention(d, num_heads, dropout)
            self.addnorm1 = AddNorm(d, dropout)
            self.attention2 = attention(d, num_heads, dropout)
            self.addnorm2 = AddNorm(d, dropout)
            self.ffn = PositionWiseFFN(d, ffn_num_hiddens)
            self.addnorm3 = AddNorm(d, dropout)

        def forward(self, X, enc_outputs, key_padding_mask, causal):
            X2 = self.attention1(X, X, X, attn_mask=causal, is_causal=True, need_weights=False)[0]
            Y = self.addnorm1(X, X2)
            Y2 = self.attention2(Y, enc_outputs, enc_outputs, key_padding_mask=key_padding_mask, need_weights=False)[0]
            Y = self.addnorm2(Y, Y2)
            return self.addnorm3(Y, self.ffn(Y))

    class Encoder(nn.Module):
        def __init__(self, vocab_size, d, ffn_num_hiddens, num_heads, num_blks, dropout):
            super().__init__()
            self.embedding = TransformerEmbedding(vocab_size, d, dropout)
            self.blks = nn.ModuleList(EncoderBlock(d, ffn_num_hiddens, num_heads, dropout) for _ in range(num_blks))

        def forward(self, X, key_padding_mask):
            X = self.embedding(X)
            for blk in self.blks:
                X = blk(X, key_padding_mask)
            return X

    class Decoder(nn.Module):
        def __init__(self, vocab_size, d, ffn_num_hiddens, num_heads, num_blks, dropout):
            super().__init__()
            self.embedding = TransformerEmbedding(vocab_size, d, dropout)
            self.blks = nn.ModuleList(DecoderBlock(d, ffn_num_hiddens, num_heads, dropout) for _ in range(num_blks))
            self.dense = nn.Linear(d, vocab_size)

        def forward(self, X, enc_outputs, key_padding_mask):
            T = X.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=X.device).triu_(1)  # True = may not attend
            X = self.embedding(X)
            for blk in self.blks:
                X = blk(X, enc_outputs, key_padding_mask, causal)
            return self.dense(X)

    class EncoderDecoder(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            args = (cfg.num_hiddens, cfg.ffn_num_hiddens, cfg.num_heads, cfg.num_blks, cfg.dropout)
            self.encoder = Encoder(SRC_VOCAB, *args)
            self.decoder = Decoder(TGT_VOCAB, *args)

        def forward(self, enc_X, dec_X, enc_valid_lens):
            # valid_lens -> key_padding_mask (True = padding, not attended), as minitensor's masked_softmax
            key_padding_mask = torch.arange(enc_X.shape[1], device=enc_X.device) >= enc_valid_lens[:, None]
            return self.decoder(dec_X, self.encoder(enc_X, key_padding_mask), key_padding_mask)

    return EncoderDecoder


def build_torch(torch, cfg, state=None, seed=0):
    """The twin and its Adam; ``state``: minitensor's parameters (NumPy, by name) to start from."""
    torch.manual_seed(seed)
    model = torch_model_class(torch)(cfg)
    if state is not None:
        load_minitensor_state(torch, model, state)
    model.train()
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def load_minitensor_state(torch, model, state):
    ours = dict(model.named_parameters())
    with torch.no_grad():
        for name, array in as_torch_names(state).items():
            ours[name].copy_(torch.from_numpy(array))


def as_torch_names(arrays):
    """minitensor's parameter names -> the twin's: the W_q, W_k, W_v of a MultiHeadAttention
    stacked into ``in_proj_weight``, W_o renamed ``out_proj.weight``."""
    out = {}
    for name, array in arrays.items():
        prefix, _, rest = name.rpartition(".W_")
        if not prefix:
            out[name] = array
        elif rest == "q.weight":
            out[f"{prefix}.in_proj_weight"] = np.concatenate([arrays[f"{prefix}.W_{x}.weight"] for x in "qkv"])
        elif rest == "o.weight":
            out[f"{prefix}.out_proj.weight"] = array
    return out


def torch_batches(torch, batches):
    return [{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in b.items()} for b in batches]


def torch_step(torch, model, optimizer, batch):
    def compute_loss():
        logits = model(batch["enc_X"], batch["dec_X"], batch["enc_valid_lens"])
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch["Y"].reshape(-1), ignore_index=PAD
        )

    return timed_step(optimizer, compute_loss)  # torch's zero_grad() sets grads to None by default


def torch_grads(model):
    return {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


def num_parameters(model):
    return sum(int(p.numel()) for p in model.parameters())


# -- checks ---------------------------------------------------------------------------------------
def check_twin(cfg, torch):
    """Same parameter count; with the same weights and no dropout, the same loss and gradients."""
    mt_model, _ = build_minitensor(cfg)
    n_mt = num_parameters(mt_model)
    if torch is None:
        print(f"[{cfg.name}] minitensor: {n_mt:,} parameters")
        return
    t_model, _ = build_torch(torch, cfg, state=minitensor_state(mt_model))
    n_t = num_parameters(t_model)
    mt_model.eval()
    t_model.eval()  # dropout off in both
    # A smaller batch of the same shapes otherwise: the same code paths, seconds less at the larger size.
    (batch,) = make_batches(replace(cfg, batch_size=min(cfg.batch_size, 16)), n=1, seed=123)
    mt_loss, _ = minitensor_step(mt_model, _NoStep(), minitensor_batches([batch])[0])
    t_loss, _ = torch_step(torch, t_model, _NoStep(), torch_batches(torch, [batch])[0])
    ours, theirs = as_torch_names(minitensor_grads(mt_model)), torch_grads(t_model)
    if ours.keys() != theirs.keys():
        raise SystemExit(f"[{cfg.name}] the twin's parameters differ: {sorted(ours.keys() ^ theirs.keys())}")
    # |a - b| / |b| per parameter (Frobenius norms): a ReLU input within rounding of 0 may go
    # either way, so single elements can differ more than float32 rounding at the larger size.
    worst_name, worst = max(
        (
            (name, float(np.linalg.norm(ours[name] - theirs[name]) / (np.linalg.norm(theirs[name]) + 1e-30)))
            for name in ours
        ),
        key=lambda pair: pair[1],
    )
    loss_diff = abs(mt_loss.item() - t_loss.item()) / abs(t_loss.item())
    print(
        f"[{cfg.name}] parameters: minitensor {n_mt:,}, torch {n_t:,}; same weights, no dropout: loss "
        f"{mt_loss.item():.5f} vs {t_loss.item():.5f} (rel. diff {loss_diff:.1e}), gradients' largest relative "
        f"difference |a - b| / |b| {worst:.1e} ({worst_name})"
    )
    if n_mt != n_t or loss_diff > 1e-4 or worst > 1e-3:
        raise SystemExit(f"[{cfg.name}] minitensor and the PyTorch twin disagree: they do different work")


class _NoStep:
    """An optimiser stand-in for the agreement check (gradients are compared, not applied)."""

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        pass


# -- timing ----------------------------------------------------------------------------------------
def make_cases(cfg, torch):
    batches = make_batches(cfg)
    mt_model, mt_opt = build_minitensor(cfg)
    mt_data = minitensor_batches(batches)
    counter = {"minitensor": 0, "torch": 0}

    def next_batch(name, data):
        counter[name] += 1
        return data[counter[name] % len(data)]

    cases = {"minitensor": lambda: minitensor_step(mt_model, mt_opt, next_batch("minitensor", mt_data))[1]}
    if torch is not None:
        t_model, t_opt = build_torch(torch, cfg, state=minitensor_state(mt_model))
        t_data = torch_batches(torch, batches)
        cases["torch"] = lambda: torch_step(torch, t_model, t_opt, next_batch("torch", t_data))[1]
    return cases


BACKWARD_SCALING = 1.6  # large config: minitensor's 1-thread / 2-thread backward time
OPTIMIZER_VS_TORCH = 1.0  # large config: Adam's step / torch's


def run_config(cfg, torch, rounds, warmup):
    """Rows of the table and (ok, message) verdicts for one configuration."""
    rows, verdicts, backward = [], [], {}
    for threads in THREAD_COUNTS:
        with limit_threads(threads, torch):
            stats = interleaved(make_cases(cfg, torch), rounds, warmup)
        for phase in ("forward", "backward", "optimizer", "total"):
            ours = stats[f"minitensor/{phase}"]
            row = [cfg.name, threads, "step" if phase == "total" else phase, format_stats(ours)]
            if torch is not None:
                theirs = stats[f"torch/{phase}"]
                row += [format_stats(theirs), format_ratio(ours.median / theirs.median)]
            rows.append(row)
        backward[threads] = stats["minitensor/backward"].median
        if torch is not None:
            ratio = stats["minitensor/total"].median / stats["torch/total"].median
            verdicts.append(
                (
                    ratio <= cfg.target,
                    f"{cfg.name}, {threads} thread(s): a step takes {ratio:.2f}x torch's (target <= {cfg.target}x)",
                )
            )
            if cfg.name == "large":
                ratio = stats["minitensor/optimizer"].median / stats["torch/optimizer"].median
                verdicts.append(
                    (
                        ratio <= OPTIMIZER_VS_TORCH,
                        f"large, {threads} thread(s): Adam takes "
                        f"{ratio:.2f}x torch's (target <= {OPTIMIZER_VS_TORCH}x)",
                    )
                )
    if cfg.name == "large" and {1, 2} <= backward.keys():
        scaling = backward[1] / backward[2]
        verdicts.append(
            (
                scaling >= BACKWARD_SCALING,
                f"large: the backward is {scaling:.2f}x faster at 2 threads than at 1 (target >= {BACKWARD_SCALING}x)",
            )
        )
    return rows, verdicts


# -- profile ---------------------------------------------------------------------------------------
def graph_nodes(root):
    """The Function nodes of the graph behind ``root``, counted by class: one backward call each."""
    from collections import Counter

    counts, seen, stack = Counter(), set(), [root._ctx]
    while stack:
        ctx = stack.pop()
        if ctx is None or id(ctx) in seen:
            continue
        seen.add(id(ctx))
        counts[type(ctx).__name__] += 1
        stack.extend(x._ctx for x in ctx.inputs if getattr(x, "_ctx", None) is not None)
    return counts


def median_step(step, n):
    return sorted(step()[1]["total"] for _ in range(n))[n // 2]


def fixed_cost(cfg, torch, threads, n=20):
    """Median step times at ``cfg``'s batch and at batch 1 for both libraries: at batch 1 the
    arithmetic is next to nothing, so that step is the per-op overhead of the library."""
    out = {}
    for batch_size in (cfg.batch_size, 1):
        c = replace(cfg, batch_size=batch_size)
        batches = make_batches(c)
        model, opt = build_minitensor(c)
        data = minitensor_batches(batches)
        it = iter(range(10**9))
        step = functools.partial(minitensor_step, model, opt)
        out["minitensor", batch_size] = median_step(
            lambda step=step, data=data, it=it: step(data[next(it) % len(data)]), n
        )
        if torch is not None:
            t_model, t_opt = build_torch(torch, c)
            t_data = torch_batches(torch, batches)
            t_step = functools.partial(torch_step, torch, t_model, t_opt)
            out["torch", batch_size] = median_step(lambda s=t_step, d=t_data, it=it: s(d[next(it) % len(d)]), n)
    return out


def torch_op_count(torch, cfg, threads, steps=5):
    """aten op calls per step seen by torch.profiler: (top level, all including nested)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    batches = make_batches(cfg)
    model, opt = build_torch(torch, cfg)
    data = torch_batches(torch, batches)
    for i in range(3):
        torch_step(torch, model, opt, data[i % len(data)])
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            torch_step(torch, model, opt, data[i % len(data)])
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    return len(top) / steps, len(aten) / steps, prof


def op_body_times(step, steps):
    """Seconds per step inside every op's ``forward`` and ``backward`` (the NumPy and kernel
    work, with the op's own Python), by op kind, and the median step time meanwhile.

    Wraps the ``forward`` / ``backward`` of every Function subclass for the duration (the
    classes are restored afterwards); the wrappers add ~0.3 us per call."""
    from collections import defaultdict

    from minitensor.autograd import Function

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    seconds, calls, originals = defaultdict(float), defaultdict(int), []

    def wrap(fn, phase):
        def timed_body(ctx, *args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(ctx, *args, **kwargs)
            finally:
                key = (type(ctx).__name__, phase)
                seconds[key] += time.perf_counter() - start
                calls[key] += 1

        return staticmethod(timed_body)

    for cls in set(subclasses(Function)):
        for phase in ("forward", "backward"):
            if isinstance(cls.__dict__.get(phase), staticmethod):
                originals.append((cls, phase, cls.__dict__[phase]))
                setattr(cls, phase, wrap(cls.__dict__[phase].__func__, phase))
    try:
        totals = [step()[1]["total"] for _ in range(steps)]
    finally:
        for cls, phase, original in originals:
            setattr(cls, phase, original)
    per_step = {key: value / steps for key, value in seconds.items()}
    return per_step, {key: n / steps for key, n in calls.items()}, sorted(totals)[steps // 2]


def profile(cfg, torch, threads=1, steps=30):
    """Where minitensor's step goes: op counts and costs, fixed per-op cost against
    PyTorch's, cProfile, and torch.profiler for the twin."""
    import cProfile
    import io
    import pstats

    print(f"\n== Profile of the {cfg.name} step at {threads} thread(s) ==")
    load_minitensor_kernels()
    batches = make_batches(cfg)
    model, opt = build_minitensor(cfg)
    data = minitensor_batches(batches)
    it = iter(range(10**9))

    def step():
        return minitensor_step(model, opt, data[next(it) % len(data)])

    with limit_threads(threads, torch):
        for _ in range(5):
            step()
        nodes = graph_nodes(model_loss(model, data[0]))
        phases = [step()[1] for _ in range(steps)]
        body, body_calls, body_step = op_body_times(step, steps)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            step()
        profiler.disable()
        costs = fixed_cost(cfg, torch, threads)
        torch_ops = torch_op_count(torch, cfg, threads) if torch is not None else None

    stats = pstats.Stats(profiler)
    applies = sum(v[1] for k, v in stats.stats.items() if k[2] == "apply" and k[0].endswith("autograd.py")) / steps
    updates = sum(v[1] for k, v in stats.stats.items() if k[2] == "update" and "optim" in k[0]) / steps
    print(
        f"\nminitensor, per step: {applies:.0f} Function.apply calls (ops run forward), {sum(nodes.values())} of "
        f"them recorded in the graph (one backward call each), {updates:.0f} Adam updates (one per parameter "
        "tensor, ~10 NumPy calls each)"
    )
    if torch_ops is not None:
        top, every, _ = torch_ops
        print(
            f"PyTorch, per step (torch.profiler): {top:.0f} top-level aten calls, {every:.0f} with the nested ones "
            "(autograd's backward nodes and Adam's per-parameter ops included)"
        )

    median = {phase: sorted(p[phase] for p in phases)[steps // 2] for phase in phases[0]}
    kinds = sorted(
        {name for name, _ in body}, key=lambda n: -(body.get((n, "forward"), 0) + body.get((n, "backward"), 0))
    )
    rows = []
    for name in kinds:
        f, b = body.get((name, "forward"), 0.0), body.get((name, "backward"), 0.0)
        n = body_calls.get((name, "forward"), 0)
        rows.append(
            [
                name,
                f"{n:.0f}",
                format_time(f),
                format_time(b),
                format_time(f + b),
                format_time((f + b) / n) if n else "-",
            ]
        )
    inside = sum(body.values())
    rows.append(
        [
            "all ops",
            f"{sum(v for (_, p), v in body_calls.items() if p == 'forward'):.0f}",
            format_time(sum(v for (_, p), v in body.items() if p == "forward")),
            format_time(sum(v for (_, p), v in body.items() if p == "backward")),
            format_time(inside),
            "",
        ]
    )
    print_table(
        ["op", "calls", "forward", "backward", "total", "per call"],
        rows,
        title="Time per step inside each kind of op's forward and backward (NumPy / kernel work)",
    )
    print(
        f"median step {format_time(median['total'])} (forward {format_time(median['forward'])}, backward "
        f"{format_time(median['backward'])}, Adam {format_time(median['optimizer'])}); with the op timers "
        f"{format_time(body_step)}, of which {format_time(inside)} inside op bodies: the rest, "
        f"{format_time(body_step - inside)}, is the engine's and the modules' Python around them "
        f"({format_time((body_step - inside) / applies)} per op) and Adam"
    )

    rows = []
    for lib in ("minitensor", "torch"):
        if (lib, 1) not in costs:
            continue
        full, one = costs[lib, cfg.batch_size], costs[lib, 1]
        rows.append([lib, format_time(full), format_time(one), format_time(full - one), f"{one / full:.0%}"])
    print_table(
        ["library", f"step, batch {cfg.batch_size}", "step, batch 1", "difference", "batch-1 share"],
        rows,
        title="The same step at batch 1, where the arithmetic is next to nothing: the fixed cost of the ops",
    )
    line = (
        f"fixed cost per op: minitensor {format_time(costs['minitensor', 1] / applies)} (per forward op, with its "
        "backward and a share of Adam)"
    )
    if torch_ops is not None:
        line += f", PyTorch {format_time(costs['torch', 1] / torch_ops[0])} (per top-level aten call)"
    print(line)

    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    print(f"\ncProfile of {steps} minitensor steps, by own time (the profiler inflates Python-heavy code):")
    print("\n".join(line for line in out.getvalue().splitlines()[4:] if line.strip()))
    if torch_ops is not None:
        print("\ntorch.profiler of 5 PyTorch steps, by self CPU time:")
        print(torch_ops[2].key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def model_loss(model, batch):
    """The loss of ``batch`` with its graph (no backward)."""
    import minitensor as mt

    logits = model(batch["enc_X"], batch["dec_X"], batch["enc_valid_lens"])
    return mt.cross_entropy(logits, batch["Y"], mask=batch["mask"])


# -- main ------------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only D2L's configuration, few rounds (for CI)")
    parser.add_argument("--profile", action="store_true", help="also profile minitensor's D2L-configuration step")
    parser.add_argument(
        "--config",
        choices=[*CONFIGS, "all"],
        default=None,
        help="which configuration(s) to time (default: all; d2l with --quick)",
    )
    args = parser.parse_args()
    names = (
        ["d2l"]
        if args.quick and args.config is None
        else list(CONFIGS)
        if args.config in (None, "all")
        else [args.config]
    )
    torch = import_torch()
    print_header("Transformer training step (forward + loss + backward + Adam), minitensor vs PyTorch", args.quick)
    if torch is None:
        print("PyTorch is not installed: its columns are left out")
    if os.getloadavg()[0] >= 0.5:
        print(
            "note: other processes are running (load average >= 0.5); timings at 2 threads suffer most, as a "
            "thread pool waits for its thread on the busy core at every parallel region"
        )
    load_minitensor_kernels()
    rows, verdicts = [], []
    for name in names:
        cfg = CONFIGS[name]
        rounds, warmup = (QUICK_ROUNDS, QUICK_WARMUP) if args.quick else (cfg.rounds, cfg.warmup)
        rounds = min(rounds, cfg.rounds)
        print(f"[{name}] {cfg.describe()}; {rounds} interleaved rounds after {warmup} warm-up per thread count")
        check_twin(cfg, torch)
        r, v = run_config(cfg, torch, rounds, warmup)
        rows += r
        verdicts += v
    headers = ["config", "threads", "phase", "minitensor"] + (["torch", "mt/torch"] if torch is not None else [])
    print_table(headers, rows, title="Median time per training step (±IQR/2)")
    for ok, message in verdicts:
        print(f"{verdict(ok)}  {message}")
    if args.profile:
        profile(CONFIGS["d2l"], torch)


if __name__ == "__main__":
    main()
