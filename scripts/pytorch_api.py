"""Compare minitensor's public API with PyTorch's and write docs/pytorch_differences.md.

    python scripts/pytorch_api.py            # rewrite the page
    python scripts/pytorch_api.py --check    # exit 1 if the page is out of date

For every public name of ``minitensor``, ``minitensor.nn``, ``minitensor.nn.functional``,
``minitensor.optim``, ``minitensor.optim.lr_scheduler`` and ``minitensor.utils.data``, and every public attribute of
``minitensor.Tensor``, the page says whether PyTorch has it and, where both do, which parameter
names and defaults differ (read with ``inspect.signature``). Every difference needs a line in
``REASONS`` below -- why minitensor differs, or "not yet aligned" and what aligning would take --
and every name that was made to match PyTorch says so in ``ALIGNED``. A difference without
either is printed as "MISSING" and fails ``tests/test_pytorch_api.py``, which also checks that
the committed page is exactly what this script writes (so neither can go stale).

PyTorch's functions are mostly C builtins, whose signatures ``inspect`` cannot read. For those
the script reads the signature lines of the builtin's docstring (``softmax(input, dim, *,
dtype=None) -> Tensor``, and the ``.. function::`` lines of overloads) and says so in the row;
where there is none, the row says that the signature cannot be read. Nothing is guessed.
"""

import argparse
import ast
import importlib
import inspect
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "pytorch_differences.md"

#: (minitensor module, its PyTorch counterpart, the prefix names get on the page)
MODULES = [
    ("minitensor", "torch", "mt."),
    ("minitensor.nn", "torch.nn", "mt.nn."),
    ("minitensor.nn.functional", "torch.nn.functional", "mt.nn.functional."),
    ("minitensor.optim", "torch.optim", "mt.optim."),
    ("minitensor.optim.lr_scheduler", "torch.optim.lr_scheduler", "mt.optim.lr_scheduler."),
    ("minitensor.utils.data", "torch.utils.data", "mt.utils.data."),
]

#: minitensor names whose PyTorch counterpart lives elsewhere (or has another name)
ELSEWHERE = {
    "mt.gelu": "torch.nn.functional.gelu",
    "mt.linear": "torch.nn.functional.linear",
    "mt.cross_entropy": "torch.nn.functional.cross_entropy",
    "mt.gradcheck": "torch.autograd.gradcheck",
    "mt.Function": "torch.autograd.Function",
    "mt.nn.MultiHeadAttention": "torch.nn.MultiheadAttention",
    "mt.nn.TransformerEncoderBlock": "torch.nn.TransformerEncoderLayer",
    "mt.nn.TransformerDecoderBlock": "torch.nn.TransformerDecoderLayer",
    "mt.optim.clip_grad_norm_": "torch.nn.utils.clip_grad_norm_",
    "mt.optim.LRScheduler": "torch.optim.lr_scheduler.LRScheduler",
    "mt.optim.LambdaLR": "torch.optim.lr_scheduler.LambdaLR",
    "mt.optim.StepLR": "torch.optim.lr_scheduler.StepLR",
    "mt.optim.MultiStepLR": "torch.optim.lr_scheduler.MultiStepLR",
    "mt.optim.ExponentialLR": "torch.optim.lr_scheduler.ExponentialLR",
    "mt.optim.CosineAnnealingLR": "torch.optim.lr_scheduler.CosineAnnealingLR",
}

#: PyTorch classes whose own signature is ``(*args, **kwargs)`` and which pass their arguments
#: on to a base class: (the base class, how many of its leading parameters the class fills in)
SIGNATURE_OF_BASE = {"torch.nn.GRU": ("torch.nn.RNNBase", 1)}  # GRU passes mode="GRU" first

#: parameters that name the same thing: minitensor's spelling -> PyTorch's spellings
RENAMES = {
    "axis": ("dim",),
    "axes": ("dims", "dim"),
    "keepdims": ("keepdim",),
    "axis0": ("dim0",),
    "axis1": ("dim1",),
    "start_axis": ("start_dim",),
    "end_axis": ("end_dim",),
    "stop": ("end",),
    "shape": ("size",),
    "grad": ("gradient",),
    "num_hiddens": ("hidden_size", "embed_dim", "d_model"),
    "num_heads": ("nhead",),
    "ffn_num_hiddens": ("dim_feedforward",),
    "use_bias": ("bias",),
    "key_size": ("kdim",),
    "value_size": ("vdim",),
    "fn": ("func",),
}

#: PyTorch parameters not compared: performance, memory layout and legacy switches that have
#: nothing to select in minitensor (see the page's "How to read it")
IGNORED = {
    "out",
    "layout",
    "pin_memory",
    "memory_format",
    "non_blocking",
    "foreach",
    "fused",
    "capturable",
    "differentiable",
    "size_average",
    "reduce",
    "_stacklevel",
    "_weight",
    "_freeze",
}

# -- why: one line per difference ----------------------------------------------------------------
# Shared reasons first, then REASONS by name. "teaching choice": minitensor differs on purpose;
# "extra": not in PyTorch; "not yet aligned": an oversight or missing feature, with what it takes.
AXIS = "teaching choice: NumPy's `axis`/`keepdims` in the signature; PyTorch's `dim`/`keepdim` work too (see above)"
DTYPE_ARG = "no `dtype=` (not yet aligned: it would be a cast before the op; `x.to(dtype)` does it)"
SQUEEZE = AXIS + "; squeezing an axis longer than 1 is a ShapeError (PyTorch leaves such an axis as it is)"
CORRECTION = AXIS + "; `correction=` (PyTorch's newer name), not the older `unbiased=`"
DEVICE = "`device='cpu'`: no global default device (see above the table)"
INPLACE = (
    "teaching choice: no in-place ops on the autograd graph (an in-place update changes a tensor outside it, see "
    "above the table), so no `inplace=`"
)
SAME_FUNCTION = "the same function as `{}`, whose row compares it with PyTorch's documented one"
UNREADABLE = "torch's {} has no readable signature; minitensor's matches the documented PyTorch use"
D2L_MODEL = (
    "teaching choice: D2L's class and argument names (`num_hiddens`, `ffn_num_hiddens`, `num_heads`, `num_blks`, "
    "`use_bias=False`), with the scorer / pooling / positional-encoding plugins; it takes a `TransformerConfig` "
    "(or the config's fields, D2L's arguments, from which it builds one) and builds its own attention, "
    "embedding and blocks, where PyTorch's takes ready-made layers (`encoder_layer`, `num_layers`)"
)
ERROR = "extra: minitensor's exception for {}, a {}; its message says how to fix the call"
MAX_MIN = (
    AXIS + "; with an axis it returns the values only (PyTorch: a (values, indices) pair; use argmax for indices); "
    "with a tensor as its second argument it is elementwise, `maximum` / `minimum` (PyTorch's other overload, "
    "`torch.max(X, torch.zeros_like(X))`), given by position: `other=` as a keyword is not taken"
)
LIKE = "not yet aligned: the result is always on the input's device (`device=` would be one argument)"
GENERATOR = "teaching choice: one seeded generator per device (`mt.manual_seed`), no generator objects"
CLASS_AXIS = (
    "teaching choice: the classes are the *last* axis of the logits, (..., C), as D2L's decoders output "
    "(batch, steps, vocab), where PyTorch's are axis 1, (N, C, d1, ...); 2-D logits read alike, and "
    "(N, C, d) logits with an (N, d) target are refused with a ShapeError, unless C equals d, where the "
    "two readings differ silently (D2L's older `pred.permute(0, 2, 1)` is not needed here)"
)
ALPHA = "not yet aligned: no `alpha=` (a {} alpha * b; one keyword in ops/elementwise.py)"
TRANSPOSE = (
    AXIS + "; the two axes default to the last two (the transpose of a batch of matrices, as in attention scores), "
    "where PyTorch requires both"
)
SWAPAXES = (
    "minitensor default: the last two axes (the transpose of a batch of matrices, as in attention scores), where "
    "PyTorch requires both"
)
SCHEDULE = "extra: {} (PyTorch builds it from LambdaLR or by chaining its schedulers)"

SORT = "; always stable (`stable=` is accepted and changes nothing), NaN last as in PyTorch"
REPEAT_INTERLEAVE = (
    "; no `output_size` (the counts are read to the host to size the result) and no one-argument form "
    "`repeat_interleave(repeats)`"
)
MSE_WEIGHT = "not yet aligned: no per-element `weight=` (multiply the `reduction='none'` losses by it)"

REASONS = {
    # -- minitensor ------------------------------------------------------------------------------
    "mt.autocast": (
        "bfloat16 only (PyTorch's default on a GPU is float16, which needs its GradScaler; `dtype=mt.float16` "
        "is refused); `cache_enabled` is accepted and ignored; one list of ops for both devices, PyTorch's CUDA "
        "one (on the CPU PyTorch keeps softmax, layer norm and sums in bfloat16; here they are float32, as on a "
        "GPU), with the attention (SDPA) in float32 (minitensor/core/amp.py lists them); the block is the "
        "process's, not a thread's, as `no_grad` is"
    ),
    "mt.get_autocast_dtype": UNREADABLE.format("get_autocast_dtype"),
    "mt.is_autocast_enabled": UNREADABLE.format("is_autocast_enabled"),
    "mt.AxisError": ERROR.format(
        "an axis out of range", "ShapeError and NumPy's AxisError (an IndexError, as PyTorch raises)"
    ),
    "mt.DTypeError": ERROR.format(
        "mixed float precisions, or integers where an op takes floats", "TypeError (PyTorch raises RuntimeError)"
    ),
    "mt.DeviceError": ERROR.format("mixed or missing devices", "RuntimeError, as PyTorch raises"),
    "mt.GradcheckError": "extra: what `mt.gradcheck` raises, an AssertionError saying which gradients disagree",
    "mt.GraphError": ERROR.format("a misused backward pass", "RuntimeError, as PyTorch raises"),
    "mt.ShapeError": ERROR.format("shapes that do not fit", "ValueError (PyTorch raises RuntimeError)"),
    "mt.Function": (
        "teaching choice: subclassed as in PyTorch (`forward(ctx, ...)`, `backward(ctx, grad)`, `apply`, "
        "`ctx.save_for_backward`), but forward and backward receive and return backend arrays, not Tensors "
        "(so backward never builds a graph: no double backward), and saved arrays are `ctx.saved` (PyTorch: "
        "`ctx.saved_tensors`)"
    ),
    "mt.Tensor": (
        "`mt.Tensor(data, requires_grad=False, dtype=None, device=None)` builds a tensor from data like "
        "`mt.tensor`; PyTorch's `torch.Tensor(...)` is a legacy constructor; use `mt.tensor` / `torch.tensor`"
    ),
    "mt.add": ALPHA.format("+"),
    "mt.sub": ALPHA.format("-"),
    "mt.alpha_entmax": "extra: alpha-entmax (Peters et al., 2019), a sparse softmax for attention weights",
    "mt.flash_attention": (
        "extra: streamed attention (online softmax) with minitensor's masks: valid_lens, a lower-right `causal`, "
        "a relative bias table (a window too); `F.scaled_dot_product_attention` takes PyTorch's call to it "
        "(both take `dropout_p`, applied inside the stream, and grouped K/V heads)"
    ),
    "mt.entmax15": "extra: 1.5-entmax (Peters et al., 2019), a sparse softmax for attention weights",
    "mt.sparsemax": "extra: sparsemax (Martins and Astudillo, 2016), attention weights that can be exactly 0",
    "mt.masked_softmax": "extra: D2L's `masked_softmax` (valid_lens or a bool mask; a fully masked row gives zeros)",
    "mt.arange": (
        "teaching choice: NumPy's `arange(start, stop, step)` (`arange(5)` works in both); " + DEVICE + "; "
        "no `requires_grad=` (not yet aligned: one argument in creation.py)"
    ),
    "mt.argmax": AXIS,
    "mt.argmin": AXIS,
    "mt.astype": "extra: NumPy's name for a (differentiable) dtype cast; `x.to(dtype)` as in PyTorch works too",
    "mt.available_backends": "extra: the registered device names (backends/); PyTorch asks `torch.cuda.is_available()`",
    "mt.get_backend": "extra: the Backend object (array module and kernels) of a device, for ops and plugins",
    "mt.hookimpl": (
        "extra: marks a plugin hook implementation (`minitensor.plugins.hookimpl`); PyTorch has no plugin registry"
    ),
    "mt.bool_": "extra: NumPy's name for `mt.bool`",
    "mt.float16": "behaviour: minitensor's dtypes are NumPy's (`numpy.float16`), as the data are NumPy/CuPy arrays",
    "mt.float32": "behaviour: minitensor's dtypes are NumPy's (`numpy.float32`), as the data are NumPy/CuPy arrays",
    "mt.float64": "behaviour: minitensor's dtypes are NumPy's (`numpy.float64`), as the data are NumPy/CuPy arrays",
    "mt.int32": "behaviour: minitensor's dtypes are NumPy's (`numpy.int32`), as the data are NumPy/CuPy arrays",
    "mt.int64": "behaviour: minitensor's dtypes are NumPy's (`numpy.int64`), as the data are NumPy/CuPy arrays",
    "mt.long": "behaviour: minitensor's dtypes are NumPy's (`numpy.int64`), as the data are NumPy/CuPy arrays",
    "mt.bool": "behaviour: minitensor's dtypes are NumPy's (`numpy.bool_`), as the data are NumPy/CuPy arrays",
    "mt.cat": AXIS,
    "mt.chunk": AXIS,
    "mt.concat": AXIS,
    "mt.stack": AXIS,
    "mt.split": AXIS,
    "mt.squeeze": SQUEEZE,
    "mt.flatten": AXIS,
    "mt.var": CORRECTION,
    "mt.max": MAX_MIN,
    "mt.min": MAX_MIN,
    "mt.sum": AXIS + "; " + DTYPE_ARG,
    "mt.mean": AXIS + "; " + DTYPE_ARG,
    "mt.softmax": AXIS + "; " + DTYPE_ARG,
    "mt.transpose": TRANSPOSE,
    "mt.swapaxes": SWAPAXES,
    "mt.conv1d": "not yet aligned: no grouped convolution (`groups=`, in ops/conv.py)",
    "mt.conv2d": "not yet aligned: no grouped convolution (`groups=`, in ops/conv.py); `padding` a number or a "
    "pair, not PyTorch's 'same' / 'valid' strings",
    "mt.cross_entropy": (
        "extra: `mask=` (D2L's padding mask over target tokens, besides `ignore_index`); not yet aligned: no "
        "per-class `weight=` (a weighted mean in ops/loss.py); "
    )
    + CLASS_AXIS,
    "mt.div": "not yet aligned: true division only; no `rounding_mode=` (floor or trunc division)",
    "mt.dropout": SAME_FUNCTION.format("mt.nn.functional.dropout"),
    "mt.embedding": SAME_FUNCTION.format("mt.nn.functional.embedding"),
    "mt.layer_norm": SAME_FUNCTION.format("mt.nn.functional.layer_norm"),
    "mt.batch_norm": SAME_FUNCTION.format("mt.nn.functional.batch_norm"),
    "mt.log_softmax": SAME_FUNCTION.format("mt.nn.functional.log_softmax"),
    "mt.relu": SAME_FUNCTION.format("mt.nn.functional.relu"),
    "mt.masked_fill": UNREADABLE.format("`masked_fill` function") + " (`Tensor.masked_fill(mask, value)`)",
    "mt.finfo": UNREADABLE.format("`finfo` class")
    + " (`finfo(dtype=None)`, float32 by default): NumPy's `finfo` (ml_dtypes' for bfloat16) with the same limits, "
    "given as NumPy numbers of the dtype where PyTorch gives Python floats; its `resolution` (10**-precision) is "
    "rounded to the dtype",
    "mt.no_grad": (
        "aligned: `@mt.no_grad` works bare and with parentheses, as PyTorch's; PyTorch takes `orig_func` in "
        "`__new__`, which its signature does not show"
    ),
    "mt.expand": "extra: the function form of `Tensor.expand`, which PyTorch has only as a method",
    "mt.from_dlpack": (
        "not yet aligned: always zero-copy, on the producer's device; DLPack 1.0's `device=` and `copy=` are not taken"
    ),
    "mt.full": "teaching choice: " + DEVICE,
    "mt.ones": "teaching choice: " + DEVICE,
    "mt.zeros": "teaching choice: " + DEVICE,
    "mt.ones_like": "not yet aligned: the result is always on the input's device (`device=` would be one argument)",
    "mt.zeros_like": "not yet aligned: the result is always on the input's device (`device=` would be one argument)",
    "mt.rand": ("teaching choice: one seeded generator per device (`mt.manual_seed`), no generator objects; " + DEVICE),
    "mt.randn": (
        "teaching choice: one seeded generator per device (`mt.manual_seed`), no generator objects; " + DEVICE
    ),
    "mt.randint": (
        "teaching choice: NumPy's `integers(low, high, shape)`, always int64, no generator objects; " + DEVICE + "; "
        "PyTorch's short form `randint(high, shape)` draws from [0, high) as its `low=0` does; "
        "not yet aligned: `shape` is PyTorch's `size`, no `requires_grad=`"
    ),
    "mt.multinomial": "teaching choice: one seeded generator per device (`mt.manual_seed`), no generator objects",
    "mt.topk": AXIS + "; the values always come sorted (PyTorch leaves the order unspecified with `sorted=False`)",
    "mt.eye": "teaching choice: " + DEVICE,
    "mt.linspace": "teaching choice: " + DEVICE,
    "mt.empty": (
        "teaching choice: " + DEVICE + "; the values are zeros (which cost no more), where PyTorch's are whatever the "
        "memory held"
    ),
    "mt.empty_like": LIKE + "; the values are zeros, as `mt.empty`'s",
    "mt.full_like": LIKE,
    "mt.rand_like": GENERATOR + "; " + LIKE,
    "mt.randn_like": GENERATOR + "; " + LIKE,
    "mt.randperm": (
        GENERATOR + "; " + DEVICE + "; `dtype='int64'` is `mt.int64`; no `requires_grad=` (positions are integers, "
        "which carry no gradient)"
    ),
    "mt.cumsum": AXIS + "; " + DTYPE_ARG,
    "mt.prod": AXIS + "; " + DTYPE_ARG,
    "mt.std": CORRECTION,
    "mt.logsumexp": AXIS + "; `axis=None` reduces every axis, where PyTorch requires `dim`",
    "mt.norm": (
        AXIS + "; " + DTYPE_ARG + "; `p` is 'fro' (2) or a number > 0, `math.inf` included; not yet aligned: no "
        "nuclear norm ('nuc'), no p <= 0 (`torch.linalg.vector_norm` is PyTorch's preferred spelling)"
    ),
    "mt.gather": "no `sparse_grad=`: minitensor has no sparse tensors, so the gradient is dense (PyTorch's default)",
    "mt.mm": "not yet aligned: no `out_dtype` (PyTorch's float32 result of float16 inputs): the inputs' dtype",
    "mt.normal": (
        "teaching choice: one seeded generator per device (`mt.manual_seed`), no generator objects; `dtype`, "
        "`device` and `requires_grad` are those PyTorch's `size=` forms take as keywords"
    ),
    "mt.sort": AXIS + SORT,
    "mt.repeat_interleave": AXIS + REPEAT_INTERLEAVE,
    "mt.repeat": "extra: the function form of `Tensor.repeat` (NumPy's `tile`), as each method here has one",
    "mt.bmm": "not yet aligned: no `out_dtype` (PyTorch's float32 result of float16 inputs): the inputs' dtype",
    "mt.one_hot": "extra: `nn.functional.one_hot` at the top level too, as `mt.cross_entropy` is",
    "mt.mse_loss": "extra: `nn.functional.mse_loss` at the top level too, as `mt.cross_entropy` is",
    "mt.get_printoptions": "extra: reads back what `set_printoptions` set (PyTorch has no public getter)",
    "mt.getitem": "extra: the function behind `x[index]` (as `operator.getitem`)",
    "mt.gradcheck": (
        "teaching choice: a small gradcheck for learners: central differences in float64 on a random weighting of "
        "the outputs (`seed`), True or a GradcheckError naming the worst entry; PyTorch's switches check "
        "features minitensor lacks (forward mode, batched and sparse gradients)"
    ),
    "mt.to_device": "extra: the differentiable function behind `Tensor.to(device)`",
    "mt.utils.data.DataLoader": (
        "teaching choice: the common case of PyTorch's loader: batches in order or shuffled (a new order each "
        "epoch from the generator `mt.manual_seed` seeds), `drop_last`, `collate_fn`; no samplers, `generator` or "
        "`pin_memory`; `num_workers` is accepted with a warning and nothing starts: the data are read in the "
        "calling process"
    ),
    "mt.utils.data.default_collate": (
        "behaviour: Python floats become float32 (minitensor's rule for Python numbers, as in `mt.tensor`), where "
        "PyTorch's become float64"
    ),
    "mt.save": (
        "teaching choice: writes a tensor, a list or tuple of tensors or a dict of them (a `state_dict`) as "
        "safetensors, never a pickle; other objects are refused (an optimizer's state goes into a checkpoint)"
    ),
    "mt.load": (
        "teaching choice: reads safetensors, never a pickle, so nothing in the file runs and no `weights_only` is "
        "needed (what PyTorch's `weights_only=True` approximates); `map_location` as in PyTorch"
    ),
    # -- minitensor.nn ---------------------------------------------------------------------------
    "mt.nn.AddNorm": "extra: D2L's residual connection plus layer norm (post-LN, or pre-LN with `norm_first`)",
    "mt.nn.Attention": "extra: one attention layer built from a scorer and a pooling plugin (D2L's scoring functions)",
    "mt.nn.EncoderDecoder": "extra: D2L's encoder-decoder base class (encoder, decoder, `init_state`)",
    "mt.nn.PositionWiseFFN": "extra: D2L's position-wise feed-forward network",
    "mt.nn.Seq2Seq": "extra: D2L's RNN encoder-decoder for sequence to sequence learning",
    "mt.nn.Seq2SeqAttentionDecoder": "extra: D2L's GRU decoder with additive (Bahdanau) attention",
    "mt.nn.Seq2SeqConfig": "extra: the architecture of `Seq2SeqAttentionDecoder` as one value (a frozen dataclass)",
    "mt.nn.Seq2SeqDecoder": "extra: D2L's GRU decoder without attention (the encoder's last state as a fixed context)",
    "mt.nn.KVCache": (
        "extra: the base class of key/value cache policies (plugins); PyTorch has no cache, Hugging Face's "
        "closest is transformers.Cache"
    ),
    "mt.nn.Seq2SeqEncoder": "extra: D2L's GRU encoder",
    "mt.nn.TransformerEmbedding": "extra: token embedding scaled by sqrt(num_hiddens) plus positional encoding",
    "mt.nn.TransformerConfig": (
        "extra: the architecture of the Transformer models and their blocks as one value (a frozen dataclass, "
        "like a Hugging Face config; PyTorch's Transformer layers take keyword arguments)"
    ),
    "mt.nn.TransformerLM": "extra: a decoder-only Transformer language model (the `--text` task)",
    "mt.nn.TransformerEncoder": D2L_MODEL,
    "mt.nn.TransformerDecoder": D2L_MODEL,
    "mt.nn.TransformerEncoderBlock": D2L_MODEL + "; `dropout` has no default; no `activation=` (ReLU, as in D2L)",
    "mt.nn.TransformerDecoderBlock": D2L_MODEL
    + "; `i` is the block's index, its slot in the decoder's cache (as in D2L)",
    "mt.nn.MultiHeadAttention": (
        "teaching choice: D2L's `MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False)`, batch first, "
        "called with valid_lens or a mask; scorer, pooling and positional encoding are plugins; PyTorch's "
        "`add_bias_kv` / `add_zero_attn` are not implemented"
    ),
    "mt.nn.Conv1d": (
        "not yet aligned: no grouped convolution (`groups=`) and zero padding only (`padding_mode='zeros'`), "
        "in nn/conv.py and ops/conv.py"
    ),
    "mt.nn.Conv2d": (
        "not yet aligned: no grouped convolution (`groups=`), zero padding only (`padding_mode='zeros'`) and "
        "no 'same' / 'valid' padding strings, in nn/conv.py and ops/conv.py"
    ),
    "mt.nn.LazyConv2d": (
        "not yet aligned: as `Conv2d` (no `groups=`, zero padding only, no padding strings); the weight is drawn "
        "at the first call, as `LazyLinear`'s"
    ),
    "mt.nn.Dropout": INPLACE,
    "mt.nn.ReLU": INPLACE,
    "mt.nn.Linear": (
        "extra: a list or NumPy array input becomes a tensor in the weight's dtype, and integer input is promoted "
        "to it, where PyTorch refuses both"
    ),
    "mt.optim.clip_grad_norm_": (
        "teaching choice: where the total norm is not finite (a gradient overflowed), the gradients are left as "
        "they are and the norm returned, where PyTorch scales them by max_norm / inf into zeros and NaN; the "
        "caller skips the step (`error_if_nonfinite=True` raises, as in PyTorch)"
    ),
    "mt.nn.Embedding": (
        "not yet aligned: no `max_norm` renormalisation, no `scale_grad_by_freq`, no sparse gradients (minitensor "
        "has no sparse tensors)"
    ),
    "mt.nn.GRU": (
        "teaching choice: D2L's `num_hiddens` for PyTorch's `hidden_size`; not yet aligned: no bidirectional GRU, "
        "no projections (`proj_size`); extra: integer inputs and initial states are promoted to the weights' dtype, "
        "where PyTorch refuses them"
    ),
    "mt.nn.GRUCell": (
        "teaching choice: D2L's `num_hiddens` for PyTorch's `hidden_size`; extra: integer inputs and initial "
        "states are promoted to the weights' dtype, where PyTorch refuses them"
    ),
    "mt.nn.Identity": (
        "not yet aligned: PyTorch's Identity accepts and ignores any arguments (to stand in for a configurable "
        "layer); minitensor's takes none (one line in nn/activation.py)"
    ),
    "mt.nn.Flatten": AXIS,
    "mt.nn.Softmax": AXIS + "; the axis defaults to the last, where PyTorch's None picks one (with a warning)",
    "mt.nn.LogSoftmax": AXIS + "; the axis defaults to the last, where PyTorch's None picks one (with a warning)",
    "mt.nn.ModuleList": "not yet aligned: `modules=()` where PyTorch says None; both mean no modules",
    # -- minitensor.nn.functional ----------------------------------------------------------------
    "mt.nn.functional.conv1d": "not yet aligned: no grouped convolution (`groups=`), in ops/conv.py",
    "mt.nn.functional.conv2d": "not yet aligned: no grouped convolution (`groups=`), in ops/conv.py; `padding` a "
    "number or a pair, not PyTorch's 'same' / 'valid' strings",
    "mt.nn.functional.mse_loss": MSE_WEIGHT
    + "; behaviour: a target that would broadcast the input to a larger shape ((n, 1) against (n,)) is a ShapeError, "
    "where PyTorch warns and compares every prediction with every target",
    "mt.nn.UninitializedBuffer": (
        "teaching choice: made from a tensor as `UninitializedParameter` is (an empty one that keeps the dtype and "
        "device); `materialize(data)` takes the values where PyTorch's takes a shape; whether it is saved is the "
        "module's `register_buffer(..., persistent=)`"
    ),
    "mt.nn.UninitializedParameter": (
        "teaching choice: made from a tensor as `Parameter` is (an empty one that keeps the dtype and device); "
        "`materialize(data)` takes the values where PyTorch's takes a shape"
    ),
    "mt.nn.CrossEntropyLoss": "not yet aligned: no per-class `weight=`, as `cross_entropy`; " + CLASS_AXIS,
    "mt.nn.functional.cross_entropy": (
        "extra: `mask=` (D2L's padding mask over target tokens, besides `ignore_index`); not yet aligned: no "
        "per-class `weight=` (a weighted mean in ops/loss.py); "
    )
    + CLASS_AXIS,
    "mt.nn.functional.dropout": INPLACE,
    "mt.nn.functional.scaled_dot_product_attention": (
        "aligned: PyTorch's rules (upper-left `is_causal`, bool or float `attn_mask`, `enable_gqa`); runs the "
        "stream (FlashAttention) where it pays and takes the call, else the plain path; `attn_mask` with "
        "`is_causal=True` is refused, as PyTorch's reference code refuses it"
    ),
    "mt.nn.functional.relu": INPLACE,
    "mt.nn.functional.embedding": (
        "not yet aligned: `padding_idx` lives in `nn.Embedding` (its row gets no gradient); no `max_norm`, "
        "`scale_grad_by_freq` or sparse gradients"
    ),
    "mt.nn.functional.log_softmax": AXIS + "; the axis defaults to the last; " + DTYPE_ARG,
    "mt.nn.functional.softmax": AXIS + "; the axis defaults to the last; " + DTYPE_ARG,
    "mt.nn.functional.masked_softmax": (
        "extra: D2L's `masked_softmax` (valid_lens or a bool mask; a fully masked row gives zeros)"
    ),
    # -- minitensor.optim ------------------------------------------------------------------------
    "mt.optim.Adam": (
        "not yet aligned: no AMSGrad (`amsgrad`), no `maximize`; `decoupled_weight_decay=True` is `AdamW`"
    ),
    "mt.optim.AdamW": "not yet aligned: no AMSGrad (`amsgrad`), no `maximize`",
    "mt.optim.SGD": (
        "not yet aligned: `lr` has no default (PyTorch's is 0.001; one default in optim/sgd.py); no `maximize`"
    ),
    "mt.optim.NoamLR": SCHEDULE.format("the warm-up then 1/sqrt(step) schedule of *Attention Is All You Need*"),
    "mt.optim.WarmupCosineLR": SCHEDULE.format("linear warm-up then cosine decay, `minitensor train`'s default"),
    "mt.optim.lr_scheduler.NoamLR": SCHEDULE.format(
        "the warm-up then 1/sqrt(step) schedule of *Attention Is All You Need*"
    ),
    "mt.optim.lr_scheduler.WarmupCosineLR": SCHEDULE.format(
        "linear warm-up then cosine decay, `minitensor train`'s default"
    ),
    "mt.optim.grad_norm": (
        "extra: the norm of all gradients, without clipping, for logging (PyTorch: "
        "`torch.nn.utils.get_total_norm` of the gradients)"
    ),
    # -- Tensor ------------------------------------------------------------------------------------
    "Tensor.add": ALPHA.format("+"),
    "Tensor.sub": ALPHA.format("-"),
    "Tensor.all": AXIS + "; no `keepdim` (not yet aligned)",
    "Tensor.any": AXIS + "; no `keepdim` (not yet aligned)",
    "Tensor.argmax": AXIS,
    "Tensor.argmin": AXIS,
    "Tensor.flatten": AXIS,
    "Tensor.size": AXIS,
    "Tensor.chunk": AXIS,
    "Tensor.cuda": (
        "teaching choice: minitensor computes on one GPU, the current one (`CUDA_VISIBLE_DEVICES` picks it), "
        "so no `device=`"
    ),
    "Tensor.topk": AXIS + "; the values always come sorted (PyTorch leaves the order unspecified with `sorted=False`)",
    "Tensor.split": AXIS,
    "Tensor.sort": AXIS + SORT,
    "Tensor.repeat_interleave": AXIS + REPEAT_INTERLEAVE,
    "Tensor.type": (
        "teaching choice: `x.type(mt.bool)` converts as in PyTorch; `x.type()` names the dtype "
        "(`minitensor.float32`) where PyTorch names a tensor class (`torch.FloatTensor`); no `non_blocking`"
    ),
    "Tensor.squeeze": SQUEEZE,
    "Tensor.var": CORRECTION,
    "Tensor.std": CORRECTION,
    "Tensor.cumsum": AXIS + "; " + DTYPE_ARG,
    "Tensor.prod": AXIS + "; " + DTYPE_ARG,
    "Tensor.logsumexp": AXIS + "; `axis=None` reduces every axis, where PyTorch requires `dim`",
    "Tensor.norm": (
        AXIS + "; " + DTYPE_ARG + "; `p` is 'fro' (2) or a number > 0, `math.inf` included; not yet aligned: no "
        "nuclear norm ('nuc'), no p <= 0"
    ),
    "Tensor.max": MAX_MIN,
    "Tensor.min": MAX_MIN,
    "Tensor.sum": AXIS + "; " + DTYPE_ARG,
    "Tensor.mean": AXIS + "; " + DTYPE_ARG,
    "Tensor.softmax": AXIS + "; the axis defaults to the last; " + DTYPE_ARG,
    "Tensor.log_softmax": UNREADABLE.format("`Tensor.log_softmax`") + "; see `mt.nn.functional.log_softmax`",
    "Tensor.relu": UNREADABLE.format("`Tensor.relu`") + " (`x.relu()`)",
    "Tensor.detach": UNREADABLE.format("`Tensor.detach`") + " (`x.detach()`)",
    "Tensor.transpose": TRANSPOSE,
    "Tensor.swapaxes": SWAPAXES,
    "Tensor.astype": "extra: NumPy's name for a (differentiable) dtype cast; `x.to(dtype)` works too",
    "Tensor.gelu": (
        "extra: PyTorch has `F.gelu` but no `Tensor.gelu`; a method here like `relu` and `tanh`, with "
        "`approximate='none'` as in `F.gelu`"
    ),
    "Tensor.backward": (
        "teaching choice: no double backward (backward works on arrays, see `mt.Function`), so no `create_graph`, "
        "and `retain_graph` is a plain False; not yet aligned: the gradient is `grad=` (PyTorch: `gradient=`), no "
        "`inputs=`"
    ),
    "Tensor.div": "not yet aligned: true division only; no `rounding_mode=` (floor or trunc division)",
    "Tensor.div_": "not yet aligned: true division only; no `rounding_mode=` (floor or trunc division)",
    "Tensor.numpy": (
        "teaching choice: `numpy()` always returns a host copy (never a view of the tensor's memory), so there is "
        "nothing for `force=` to force"
    ),
    "Tensor.to": (
        "`x.to('cuda')`, `x.to(mt.float64)`, `x.to(dtype=..., device=...)` as in PyTorch: the first argument "
        "(`target`) is a device or a dtype; not yet aligned: no `x.to(other_tensor)`, no `copy=`"
    ),
    "Tensor.data": "behaviour: the backend array itself (a NumPy or CuPy array), not a Tensor",
    "Tensor.device": "behaviour: the device name as a string ('cpu', 'cuda'), not a `torch.device`",
    "Tensor.dtype": "behaviour: a NumPy dtype (`mt.float32` is `numpy.float32`'s dtype), not a `torch.dtype`",
    "Tensor.grad_fn": "behaviour: the node of minitensor's graph, the `Function` instance (ctx) that made the tensor",
}

#: names made to match PyTorch, and what was done
ALIGNED = {
    "mt.gelu": "aligned: exact erf form by default, `approximate='tanh'` as an option",
    "mt.nn.GELU": "aligned: `approximate='none'`, the exact form by default",
    "mt.nn.functional.gelu": "aligned: `approximate='none'`, the exact form by default",
}

# -- reading signatures --------------------------------------------------------------------------
REQUIRED = "<required>"  # a parameter without a default
SOME_OVERLOADS = "<some overloads>"  # a PyTorch parameter that only some documented overloads take


class Param:
    """One parameter: its name, its kind (inspect.Parameter kinds) and its default, as text."""

    VAR_POSITIONAL, VAR_KEYWORD = inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD
    KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY

    def __init__(self, name, kind, default):
        self.name, self.kind, self.default = name, kind, default

    def __repr__(self):
        if self.kind == inspect.Parameter.VAR_POSITIONAL:
            return f"*{self.name}"
        if self.kind == inspect.Parameter.VAR_KEYWORD:
            return f"**{self.name}"
        if self.default == REQUIRED:
            return self.name
        if self.default == SOME_OVERLOADS:
            return f"{self.name} (some overloads)"
        return f"{self.name}={self.default}"


def _default_text(value):
    """A default as stable text: no memory addresses or file paths; functions and modules by their
    dotted names."""
    if value is inspect.Parameter.empty:
        return REQUIRED
    if inspect.ismodule(value):  # torch.save's pickle_module: its repr names the file it came from
        return value.__name__
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _from_inspect(obj):
    """Parameters from inspect.signature, without ``self``; None if it cannot read them."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = [Param(p.name, p.kind, _default_text(p.default)) for p in sig.parameters.values()]
    if params and params[0].name == "self":
        params = params[1:]
    return params


def _split_top_level(text):
    """Split a parameter list at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts]


def _parse_documented(params_text):
    """``input, dim, *, dtype=None`` -> Params (documented signatures need not be valid Python:
    ``arange(start=0, end, ...)``)."""
    params, keyword_only = [], False
    for part in _split_top_level(params_text.replace("\\*", "*")):
        if part == "*":
            keyword_only = True
            continue
        if part.startswith("**"):
            params.append(Param(part[2:].split(":")[0].strip(), inspect.Parameter.VAR_KEYWORD, REQUIRED))
            continue
        if part.startswith("*"):
            params.append(Param(part[1:].split(":")[0].strip(), inspect.Parameter.VAR_POSITIONAL, REQUIRED))
            keyword_only = True
            continue
        m = re.match(r"^(\w+)\s*(?::[^=]*)?(?:=\s*(.*))?$", part)
        if m is None:
            return None
        name, default = m.group(1), m.group(2)
        if default is None:
            default = REQUIRED
        else:
            try:
                default = _default_text(ast.literal_eval(default))
            except (ValueError, SyntaxError):
                default = default.strip()
        kind = inspect.Parameter.KEYWORD_ONLY if keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(Param(name, kind, default))
    return params


def _from_docstring(obj, name):
    """Parameters from the signature lines of a builtin's docstring, overloads merged; None if
    it documents none."""
    doc = getattr(obj, "__doc__", None) or ""
    pattern = rf"^\s*(?:\.\.\s+(?:function|method)::\s+)?{re.escape(name)}\((.*?)\)\s*(?:->.*)?$"
    overloads = []
    for line in re.findall(pattern, doc, re.M):
        params = _parse_documented(line)
        if params is not None:
            if params and params[0].name == "self":  # pow(self, exponent): a number as the base
                params[0].name = "input"
            overloads.append(params)
    # "to(*args, **kwargs)" heads a list of the real overloads: drop it when they follow
    specific = [o for o in overloads if not _only_var_args(o)]
    overloads = specific or overloads
    if not overloads:
        return None
    merged = {}
    for params in overloads:
        for p in params:
            if p.name not in merged:
                merged[p.name] = p
            elif merged[p.name].default != p.default:
                merged[p.name] = Param(p.name, p.kind, SOME_OVERLOADS)
    for p in merged.values():
        if any(p.name not in {q.name for q in o} for o in overloads) and p.kind not in (
            p.VAR_POSITIONAL,
            p.VAR_KEYWORD,
        ):
            p.default = SOME_OVERLOADS
    return list(merged.values())


def _resolve(dotted):
    """``torch.nn.utils.clip_grad_norm_`` -> the object, or None. Attributes first:
    ``torch.autograd.gradcheck`` is the function, not the module of that name."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], start=1):
        found = getattr(obj, attr, None)
        if found is None:
            try:
                found = importlib.import_module(".".join(parts[: i + 1]))
            except ImportError:
                return None
        obj = found
    return obj


def torch_params(obj, dotted):
    """(params or None, where they came from: "" for inspect, a note otherwise)."""
    if dotted in SIGNATURE_OF_BASE:
        base, skip = SIGNATURE_OF_BASE[dotted]
        params = _from_inspect(_resolve(base))
        return params[skip:], f"signature of `{base}`, to which it passes its arguments"
    params = _from_inspect(obj)
    if (
        params is not None
        and isinstance(obj, type)
        and {p.kind for p in params} == {Param.VAR_POSITIONAL, Param.VAR_KEYWORD}
    ):
        # torch.nn.Module subclasses without an __init__ of their own show Module's
        # (*args, **kwargs), which refuses any argument: they take none.
        import torch

        if issubclass(obj, torch.nn.Module) and obj.__init__ is torch.nn.Module.__init__:
            return [], ""
        return None, "signature reads `(*args, **kwargs)`"
    if params is not None:
        return params, ""
    params = _from_docstring(obj, dotted.rsplit(".", 1)[-1])
    if params is not None:
        return params, "signature from torch's docstring"
    return None, "builtin; inspect cannot read its signature and its docstring gives none"


def _only_var_args(params):
    return bool(params) and all(p.kind in (Param.VAR_POSITIONAL, Param.VAR_KEYWORD) for p in params)


# -- comparing -----------------------------------------------------------------------------------
def _same_default(a, b):
    """Do two defaults (as text) agree? 1 and 1.0 do; an overload-dependent one agrees with any."""
    if a == b or (SOME_OVERLOADS in (a, b) and REQUIRED not in (a, b)):
        return True
    try:
        va, vb = ast.literal_eval(a), ast.literal_eval(b)
    except (ValueError, SyntaxError):
        return False
    numbers = (int, float)
    if isinstance(va, numbers) and isinstance(vb, numbers) and not isinstance(va, bool) and not isinstance(vb, bool):
        return va == vb
    return False


def _positional_operand(p):
    return p.kind == p.VAR_POSITIONAL or (p.default in (REQUIRED, SOME_OVERLOADS) and p.kind != p.KEYWORD_ONLY)


def compare(mine, theirs, function=True):
    """The differences between two parameter lists, as short phrases.

    Leading required arguments of a function (the tensors it works on: ``a``, ``x`` here,
    ``input``, ``other`` in PyTorch) are matched by position, since they are passed by
    position; everything else by name, with the spellings in ``RENAMES`` counted as one name.
    """
    mine_names = {p.name for p in mine}
    theirs = [p for p in theirs if p.name not in IGNORED or p.name in mine_names]
    their_names = {p.name for p in theirs}
    pairs, left, right = [], list(mine), list(theirs)
    if function:
        while left and right and _positional_operand(left[0]) and _positional_operand(right[0]):
            a, b = left[0], right[0]
            if a.name != b.name and (a.name in their_names or b.name in mine_names):
                break
            left.pop(0), right.pop(0)
    by_name = {p.name: p for p in right}
    var_positional = [p.name for p in right if p.kind == p.VAR_POSITIONAL]
    unmatched = []
    for a in left:
        b = by_name.pop(a.name, None)
        if b is None and a.kind == a.VAR_POSITIONAL and var_positional:
            b = by_name.pop(var_positional[0])  # *shape and *size: positional either way
        if b is None:
            for alias in RENAMES.get(a.name, ()):
                if alias in by_name and alias not in mine_names:
                    b = by_name.pop(alias)
                    break
        if b is None:
            unmatched.append(a)
        else:
            pairs.append((a, b))
    diffs = []
    for a, b in pairs:
        if a.kind == b.kind == a.VAR_POSITIONAL:
            continue
        if a.name != b.name:
            diffs.append(f"`{a!r}` (torch: `{b!r}`)")
        elif a.kind != b.kind and inspect.Parameter.VAR_POSITIONAL in (a.kind, b.kind):
            diffs.append(f"`{a!r}` (torch: `{b!r}`)")
        elif not _same_default(a.default, b.default):
            diffs.append(f"`{a!r}` (torch: `{b!r}`)")
    if unmatched:
        diffs.append("only here: " + ", ".join(f"`{p!r}`" for p in unmatched))
    if by_name:
        diffs.append("only torch: " + ", ".join(f"`{p!r}`" for p in by_name.values()))
    return diffs


# -- the rows ------------------------------------------------------------------------------------
def _public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    return sorted(n for n in names if not isinstance(getattr(module, n), types.ModuleType))


def _kind(obj):
    if isinstance(obj, type):
        return "class"
    if callable(obj):
        return "function"
    return type(obj).__name__


def _row(name, obj, torch_name, torch_obj):
    """(name, torch column, differences, reason) for one public name."""
    if torch_obj is None:
        return name, "—", "not in PyTorch", REASONS.get(name, "MISSING")
    torch_col = f"`{torch_name}`"
    if not callable(obj) or isinstance(obj, property) or not callable(torch_obj):
        diff = "" if callable(obj) == callable(torch_obj) else f"{_kind(obj)} (torch: {_kind(torch_obj)})"
    else:
        if isinstance(obj, type) and issubclass(obj, BaseException):
            mine = _from_inspect(obj.__init__)
        else:
            mine = _from_inspect(obj)
        theirs, source = torch_params(torch_obj, torch_name)
        if mine is None:
            diff = "minitensor's signature cannot be read"
        elif theirs is None:
            diff = f"torch's {source}"
        else:
            diffs = compare(mine, theirs, function=not isinstance(obj, type))
            diff = "; ".join(diffs)
            if source and diffs:
                diff += f" ({source})"
    if name in REASONS:
        return name, torch_col, diff or "behaviour (see why)", REASONS[name]
    if not diff:
        return name, torch_col, "—", ALIGNED.get(name, "same")
    return name, torch_col, diff, "MISSING"


def module_rows():
    import torch  # noqa: F401  (the counterparts are looked up by name)

    rows = []
    for mt_name, torch_name, prefix in MODULES:
        module = importlib.import_module(mt_name)
        for n in _public_names(module):
            name = prefix + n
            counterpart = ELSEWHERE.get(name, f"{torch_name}.{n}")
            rows.append(_row(name, getattr(module, n), counterpart, _resolve(counterpart)))
    return rows


def tensor_rows():
    import torch

    import minitensor as mt

    rows = []
    for n in sorted(n for n in dir(mt.Tensor) if not n.startswith("_")):
        obj = inspect.getattr_static(mt.Tensor, n)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = getattr(mt.Tensor, n)
        torch_obj = getattr(torch.Tensor, n, None)
        rows.append(_row(f"Tensor.{n}", obj, f"torch.Tensor.{n}", torch_obj))
    return rows


def _table(rows):
    lines = ["| minitensor | PyTorch | differences | status, or why |", "|---|---|---|---|"]
    for name, torch_col, diff, reason in rows:
        cells = [f"`{name}`", torch_col, diff, reason]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


INTRO = """\
# minitensor and PyTorch: the differences

This page lists every public name of `minitensor`, `minitensor.nn`, `minitensor.nn.functional`, \
`minitensor.optim`, `minitensor.optim.lr_scheduler` and `minitensor.utils.data`, and every public attribute of \
`minitensor.Tensor`, beside its PyTorch counterpart (`torch`, `torch.nn`, `torch.nn.functional`, \
`torch.optim`, `torch.optim.lr_scheduler`, `torch.utils.data`, `torch.Tensor`): whether PyTorch has it, which \
parameter names and defaults differ, and either "aligned" (made to match) or why it differs — \
a teaching choice, a D2L extra, or "not yet aligned" with what aligning would take. It is \
generated, with the reasons kept in the script, by `python scripts/pytorch_api.py`; run it after \
changing the public API (`tests/test_pytorch_api.py` fails while this page is stale). \
Generated with torch {torch_version}.

How to read it:

- Signatures come from `inspect.signature`. Most of PyTorch's functions are C builtins that \
`inspect` cannot read; for those the documented signature lines of the docstring are used \
(overloads merged; "some overloads" marks a parameter only some take), and the row says so. \
Where there is no such line the row says the signature cannot be read.
- The leading required arguments of a function — the tensors it works on, `a`/`x` here and \
`input`/`other` in PyTorch — are matched by position, as they are passed; all other parameters \
by name, with minitensor's spellings of one thing counted as the same name (`axis` = `dim`, \
`keepdims` = `keepdim`, `num_hiddens` = `hidden_size`).
- "only here" / "only torch": parameters that one side lacks. PyTorch's performance, memory-layout \
and legacy switches are left out everywhere, since minitensor has nothing for them to select: \
{ignored}.
- Order and keyword-only-ness of parameters are not compared; "—" in the differences column means \
the names and defaults agree.

Together the aligned names make a GPT written as nanoGPT's `model.py` writes one (fused q/k/v \
split by `dim`, `view`/`transpose`/`contiguous`, causal `scaled_dot_product_attention`, `ModuleDict`, \
tied weights, `apply(init)`, optimiser groups by `p.dim()`, generation with `topk`, a masked \
assignment, `multinomial` and `cat`) run unchanged with minitensor in `torch`'s place: \
`tests/test_pytorch_habits.py` trains one, and checks its loss and gradients against PyTorch's. So \
does the attention chapter as D2L's PyTorch edition writes it (11.2's Nadaraya-Watson regression \
with `sort`, `repeat_interleave`, `eye`, `.type(torch.bool)`, `bmm` and `MSELoss`; `masked_softmax` \
with `sequence_mask`'s `X[~mask] = value`; additive and scaled dot-product attention; 11.4's \
Bahdanau decoder on 10.7's GRU encoder, with `X.t()`; multi-head \
attention; sinusoidal positions written with `sin`/`cos` into slices; 11.7.2's `LayerNorm` \
against `LazyBatchNorm1d`; the Transformer of `LazyLinear` layers; 11.8's vision Transformer, \
its patches cut by `LazyConv2d`): `tests/test_d2l_habits.py` \
writes it once, trains it on minitensor and checks \
its outputs and gradients against PyTorch's. `x[i] = v` in the graph is out of place underneath: \
x stands for a new node, the ops that used x before the write get the gradient of the value they \
used, and what they saved keeps its values (PyTorch refuses a backward through a saved tensor that \
was written since). Unlike PyTorch, such a write does not reach through views: x gets a new \
array, and a tensor x was reshaped or sliced from keeps its values. Where nothing else can see \
x's array (no view, no other tensor, no op that saved it), the write goes into it after all, \
since nobody could tell: `outputs[t] = y` in a loop of T steps costs T slices forward and \
backward (PyTorch's backward copies the gradient at every write; `bench/row_loop.py`).

Four differences run through the whole API:

- `axis`, `keepdims` (and `axis0`, `start_axis`, ...): minitensor's signatures use NumPy's words, \
those of the arrays underneath; PyTorch says `dim`, `keepdim` (`dim0`, `start_dim`, ...). Every \
function, method and layer with such a parameter takes PyTorch's word too, \
`x.sum(dim=1, keepdim=True)` as `x.sum(axis=1, keepdims=True)` (`torch_names` in \
minitensor/core/ops/axes.py); both words in one call are refused.
- `device='cpu'`: minitensor has no global default device, so creation functions say 'cpu' where \
PyTorch's `device=None` means its current default device (`torch.set_default_device`). Not yet \
aligned: a default device would be new state in backends/.
- In-place updates (`x += y`, `-=`, `*=`, `/=`, `add_`, `sub_`, `mul_`, `div_`, `copy_`, \
`zero_`, `x[i] = v`): outside the graph (under `no_grad`, as in D2L's `sgd`, or on tensors that \
do not require grad) they change the tensor itself, as in PyTorch, and the result must fit its \
dtype (`int_tensor += 0.5` is refused). On a tensor in the graph, `x += y` makes a new tensor `x \
+ y` and Python moves the name to it, where PyTorch changes the tensor in place and rewrites its \
history: other names for the old x keep its value; the underscore methods are refused there; \
`x[i] = v` works as described above. A leaf that requires grad is refused, as in PyTorch. \
Backward refuses a gradient whose inputs were changed in place after an op used them, as PyTorch \
does with its version counters (`autograd.WriteLog`). It passes by an op whose backward reads no \
input (`c = a + x; x += 1; c.backward()` is fine, as in PyTorch), and is a little stricter for \
the others: it checks every tensor input of such an op, not only the ones its backward saved.
- Float tensors of two precisions (`float32 + float64`, or bfloat16 and float32 outside \
`mt.autocast`) are refused with a `DTypeError` naming the op and both dtypes, where PyTorch \
promotes to the wider one: a float64 tensor slipped into a float32 model would otherwise make \
everything after it float64 (twice the memory, slower products) without a word. `.to()` one of \
them. Python numbers and integer tensors take the float tensor's dtype, as in PyTorch; inside \
`mt.autocast` bfloat16 meeting float32 gives float32, as PyTorch's autocast does.
"""


def torch_version():
    import torch

    return torch.__version__.split("+")[0]


def page(rows=None):
    """The whole markdown page, as ``scripts/pytorch_api.py`` writes it. ``rows``: the
    (module rows, Tensor rows) pair, if already computed."""
    modules, tensor = rows or (module_rows(), tensor_rows())
    intro = INTRO.format(torch_version=torch_version(), ignored=", ".join(f"`{n}`" for n in sorted(IGNORED)))
    return (
        intro
        + "\n## Modules\n\n"
        + _table(modules)
        + "\n\n## Tensor methods and attributes\n\n"
        + _table(tensor)
        + "\n"
    )


def stale_entries(rows):
    """Names in REASONS, ALIGNED or ELSEWHERE that no row has any more (renamed or removed)."""
    names = {row[0] for part in rows for row in part}
    return sorted((set(REASONS) | set(ALIGNED) | set(ELSEWHERE)) - names)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from what would be written")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    rows = module_rows(), tensor_rows()
    text = page(rows)
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/pytorch_api.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    missing = [row[0] for part in rows for row in part if row[3] == "MISSING"]
    if missing:
        print(f"rows without a reason (add them to REASONS): {', '.join(missing)}", file=sys.stderr)
    stale = stale_entries(rows)
    if stale:
        print(f"entries for names that no longer exist (remove them): {', '.join(stale)}", file=sys.stderr)
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(main())
