"""A PyTorch twin of nanoGPT's ``model.py`` (Karpathy), for ``bench/gpt_char.py``.

Written here layer for layer after nanoGPT's GPT, with the same module and parameter names, so
that its ``state_dict`` loads into nanoGPT's own ``GPT`` unchanged (``gpt_char.py`` checks that the
two give the same loss when nanoGPT's code is at hand):

    GPT
      transformer.wte      token embedding (vocab_size, n_embd), tied to lm_head.weight
      transformer.wpe      learned positions (block_size, n_embd)
      transformer.h[i]     Block: x + attn(ln_1(x)), then x + mlp(ln_2(x))       (pre-LN)
        attn.c_attn          one Linear n_embd -> 3 n_embd: the queries, keys and values
        attn.c_proj          Linear n_embd -> n_embd
        mlp.c_fc, mlp.c_proj Linear n_embd -> 4 n_embd -> n_embd, GELU (exact, erf) between
      transformer.ln_f     the final LayerNorm
      lm_head              Linear n_embd -> vocab_size, the embedding's own weight

``bias=False`` throughout (nanoGPT's option: no biases in the Linears nor the LayerNorms, which
``torch.nn.LayerNorm`` of this version cannot leave out, hence the small ``LayerNorm`` class).
Attention is ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, as nanoGPT's
"flash" path. Dropout is left out: the recipe trains without it (``dropout=0.0``).

Not imported by minitensor, nor by ``gpt_char.py`` without PyTorch: it imports torch at the top.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int  # the context: rows of the position table
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    bias: bool = False


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's): a gain, and a bias only if ``bias``."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v of every head
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, n_head, T, head size): head h owns columns h*hs .. (h+1)*hs - 1
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # softmax(q k^T / sqrt(hs)) v, causal
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # the heads side by side again
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # GPT-2's init, as nanoGPT's (the benchmark overwrites it with minitensor's weights)
        for name, p in self.named_parameters():
            if p.ndim >= 2:
                std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets=None):
        """Tokens idx (B, T) -> logits (B, T, vocab_size), and the mean cross-entropy against
        ``targets`` (B, T) when given (else None)."""
        T = idx.shape[1]
        assert T <= self.config.block_size, f"a sequence of {T} tokens, the context is {self.config.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def configure_optimizer(model, lr, betas, weight_decay):
    """nanoGPT's AdamW: weight decay on the parameters of 2+ axes (matrices, embeddings), none on
    the others (LayerNorm gains); PyTorch's default implementation on the CPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


# -- minitensor's names -> nanoGPT's ----------------------------------------------------------------
def twin_state(mt_state, n_layer):
    """nanoGPT's state dict (NumPy arrays) of a minitensor ``TransformerLM``'s parameters
    (``{name: NumPy array}``, minitensor's names). Both store a Linear's weight as (out, in), so
    no matrix is transposed; minitensor's separate W_q, W_k, W_v are stacked by rows into
    ``c_attn`` (queries first, as nanoGPT's ``split`` reads them)."""
    d = "decoder."
    out = {
        "transformer.wte.weight": mt_state[d + "embedding.token_embedding.weight"],
        "transformer.wpe.weight": mt_state[d + "embedding.pos_encoding.P"],
        "transformer.ln_f.weight": mt_state[d + "ln.weight"],
    }
    out["lm_head.weight"] = out["transformer.wte.weight"]  # tied: the same array
    for i in range(n_layer):
        b, h = f"{d}blks.{i}.", f"transformer.h.{i}."
        qkv = [mt_state[f"{b}attention1.{w}.weight"] for w in ("W_q", "W_k", "W_v")]
        out[h + "attn.c_attn.weight"] = np.concatenate(qkv, axis=0)
        out[h + "attn.c_proj.weight"] = mt_state[b + "attention1.W_o.weight"]
        out[h + "ln_1.weight"] = mt_state[b + "addnorm1.ln.weight"]
        out[h + "mlp.c_fc.weight"] = mt_state[b + "ffn.dense1.weight"]
        out[h + "mlp.c_proj.weight"] = mt_state[b + "ffn.dense2.weight"]
        out[h + "ln_2.weight"] = mt_state[b + "addnorm3.ln.weight"]
    return out


def load_twin(model, mt_state):
    """Copy a minitensor model's parameters (``{name: NumPy array}``) into the twin ``model``."""
    state = twin_state(mt_state, model.config.n_layer)
    dtype = next(model.parameters()).dtype
    model.load_state_dict({k: torch.as_tensor(v.copy()).to(dtype) for k, v in state.items()}, strict=True)
    return model
