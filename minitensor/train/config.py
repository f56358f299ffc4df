"""What a training run is made of, written down: ``TrainConfig``, and the builders that turn
one into data, vocabularies and a model.

The same config builds the model twice: once in ``train`` and once more when a checkpoint
is loaded (``minitensor translate --checkpoint DIR``), from the JSON copy saved with the
weights. So everything that shapes the model or the data lives here, as plain JSON values.

    config = TrainConfig(task="reverse", epochs=3)
    data = build_data(config)                          # pairs, vocabs, num_steps
    model = build_model(config, data.src_vocab, data.tgt_vocab)
"""

import dataclasses
import math
import os
from dataclasses import dataclass, field

from .. import optim
from ..backends import get_backend
from ..data import (
    RESERVED_TOKENS,
    Vocab,
    build_vocabs,
    char_lm_corpus,
    copy_task,
    date_task,
    max_lengths,
    preprocess,
    read_parallel_corpus,
    reverse_task,
    sort_task,
    tokenize,
    train_heldout_split,
)
from ..data.bpe import ByteBPE, symbols_to_text
from ..data.files import read_text
from ..nn.config import Seq2SeqConfig, TransformerConfig
from ..nn.seq2seq import Seq2Seq, Seq2SeqAttentionDecoder, Seq2SeqEncoder
from ..nn.transformer import (
    EncoderDecoder,
    TransformerDecoder,
    TransformerEncoder,
    TransformerLM,
    split_positional,
)
from ..precision import PRECISIONS

TASKS = ("date", "reverse", "copy", "sort")
TOKENIZERS = ("char", "bpe")  # --tokenizer of a text's language model
BPE_VOCAB_SIZE = 1024  # --vocab-size's default: 256 bytes + 768 merges
TOKENIZER_FILE = "tokenizer.json"  # where a BPE run keeps its tokenizer, in the run folder
MODELS = ("transformer", "bahdanau", "lm")
SCHEDULES = ("cosine", "noam", "constant")
ACTIVATIONS = ("relu", "gelu")  # the FFN's (TransformerConfig.activation)
INITS = ("d2l", "gpt2")  # TransformerConfig.init
OPTIMIZERS = ("adam", "adamw")
FUSED = ("auto", "on", "off")  # --fused: MultiHeadAttention's fused="auto" / True / False


# -- what each field may hold ------------------------------------------------------------------------
# A config comes from the command line or from a checkpoint's JSON, which anyone can edit, so every
# field carries its own check: a check takes the value and returns None, or what is wrong with it.
# The upper bounds are far above any run this framework is for; they exist so that an edited
# checkpoint cannot ask for a model or a data set that fills the memory before it is refused.
MAX_SIZE = 1 << 20  # hidden units, heads, blocks, sequence lengths, batch size
MAX_EXAMPLES = 10_000_000  # generated examples, corpus lines
WARMUP_FRACTION = 0.05  # of all steps: the learning-rate warm-up when --warmup-steps is not given


def is_integer(value):
    """An int, and not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value):
    """An int or float (not a bool), neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low, high=MAX_SIZE):
    def check(value):
        if not is_integer(value) or not low <= value <= high:
            return f"must be an integer from {low:,} to {high:,}"

    return check


def number(low=None, high=None, *, low_open=False, high_open=True):
    """A finite number in [low, high) (``low_open``/``high_open`` choose the brackets)."""

    def check(value):
        inside = (
            is_finite_number(value)
            and (low is None or (value > low if low_open else value >= low))
            and (high is None or (value < high if high_open else value <= high))
        )
        if not inside:
            lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
            hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
            return "must be a finite number " + " and ".join(b for b in (lo, hi) if b)

    return check


def one_of(choices):
    def check(value):
        if value not in choices:
            return f"must be one of {', '.join(choices)}"

    return check


def identifier(value):
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        return "must be a non-empty name"


def file_path(value):
    if not isinstance(value, str) or not value or len(value) > 4096 or "\0" in value:
        return "must be a file path"


def boolean(value):
    if not isinstance(value, bool):
        return "must be true or false"


def plugin_options(value):
    """Plugin options: a small dict of names to JSON scalars (what --scorer-opt k=v can give)."""
    if not isinstance(value, dict) or len(value) > 100:
        return "must be a dict of at most 100 options"
    for key, item in value.items():
        if identifier(key) or not (item is None or isinstance(item, (bool, str)) or is_finite_number(item)):
            return f"has an invalid option {key!r}: {item!r:.60}"
        if isinstance(item, str) and len(item) > 1000:
            return f"has an option {key!r} longer than 1,000 characters"


def betas_pair(value):
    """Adam's (beta1, beta2): two numbers in [0, 1) (a JSON list)."""
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(is_finite_number(b) and 0 <= b < 1 for b in value)
    if not ok:
        return "must be two numbers in [0, 1), e.g. 0.9,0.99"


def optional(check):
    def check_optional(value):
        return None if value is None else check(value)

    return check_optional


_NO_LEGACY = object()


def setting(
    default=dataclasses.MISSING,
    check=None,
    *,
    factory=dataclasses.MISSING,
    resumable=False,
    flag=None,
    legacy=_NO_LEGACY,
):
    """A TrainConfig field: its default, its ``check``, whether ``--resume`` may change it
    (``resumable``: it does not shape the model, the data or the order of the minibatches), and
    the command-line flag that sets it (default ``--field-name``), for error messages.
    ``legacy``: the value a config saved before the field existed stands for, where that is not
    the default (a checkpoint's JSON without the field then loads as the run it was)."""
    metadata = {"check": check, "resumable": resumable, "flag": flag}
    if legacy is not _NO_LEGACY:
        metadata["legacy"] = legacy
    return field(default=default, default_factory=factory, metadata=metadata)


class ConfigError(ValueError):
    """A TrainConfig field holds a value it cannot take; ``.field`` names it."""

    def __init__(self, field_name, message):
        super().__init__(message)
        self.field = field_name


def flag_of(field_name):
    """The command-line flag of a TrainConfig field: "lr" -> "--lr"."""
    spec = {f.name: f for f in dataclasses.fields(TrainConfig)}.get(field_name)
    return (spec.metadata.get("flag") if spec else None) or "--" + field_name.replace("_", "-")


@dataclass
class TrainConfig:
    """Everything a run depends on. Defaults: D2L's small Transformer (11.7.6: num_hiddens
    32, ffn_num_hiddens 64, 4 heads, 2 + 2 blocks) learning date normalisation on the CPU
    in a few minutes, with pre-LayerNorm blocks, no dropout and a peak lr of 1e-2 (warm-up,
    then cosine decay): ~100% held-out exact match after 4 epochs, where the book's post-LN
    recipe (``norm_first=False, dropout=0.1, lr=3e-3``) reaches ~66%.

    Each field declares the values it takes (``check``) and whether a resumed run may change
    it (``resumable``); ``validate()`` applies the checks, and so does ``from_dict`` (a
    checkpoint's copy). ``out`` is where the run lives, not a setting: a resumed run writes
    wherever it is now."""

    # data: a generated task, or a tab-separated corpus (``data``), or a text for a char LM
    task: str = setting("date", one_of(TASKS))
    data: str | None = setting(None, optional(file_path))
    text: str | None = setting(None, optional(file_path))
    num_train: int = setting(20_000, integer(1, MAX_EXAMPLES))  # generated training examples
    num_heldout: int = setting(1_000, integer(1, MAX_EXAMPLES))  # held-out (dates disjoint from training)
    min_len: int = setting(1, integer(1))  # sequence lengths of reverse/copy/sort
    max_len: int = setting(10, integer(1))
    # held-out lengths of reverse/copy/sort (None: as in training): longer ones test length extrapolation
    heldout_min_len: int | None = setting(None, optional(integer(1)))
    heldout_max_len: int | None = setting(None, optional(integer(1)))
    max_examples: int | None = setting(None, optional(integer(1, 1 << 40)))  # corpus lines; text characters
    heldout_fraction: float = setting(0.1, number(0, 1, low_open=True))  # of a corpus or a text
    lm_num_steps: int = setting(64, integer(1))  # window of the character LM
    # the LM's training windows: "partition", the text cut into windows at fixed places (D2L's
    # sequential partitioning), shuffled; "random", windows starting anywhere (nanoGPT's get_batch)
    lm_sampling: str = setting("partition", one_of(("partition", "random")))
    # model
    model: str = setting("transformer", one_of(MODELS))
    scorer: str | None = setting(None, optional(identifier))  # None: scaled_dot (Transformer), additive (Bahdanau)
    pooling: str = setting("softmax", identifier)
    positional: str = setting("sinusoidal", identifier)  # an "inputs", "qk" or "scores" encoding
    input_positional: str | None = setting(None, optional(identifier))  # "inputs" beside a "qk"/"scores" one
    scorer_options: dict = setting(factory=dict, check=plugin_options, flag="--scorer-opt")
    pooling_options: dict = setting(factory=dict, check=plugin_options, flag="--pooling-opt")
    positional_options: dict = setting(factory=dict, check=plugin_options, flag="--positional-opt")
    num_hiddens: int = setting(32, integer(1))
    ffn_num_hiddens: int = setting(64, integer(1))
    num_heads: int = setting(4, integer(1))
    num_kv_heads: int | None = setting(None, optional(integer(1)))  # grouped-query attention; None: num_heads
    # streamed (FlashAttention) attention: the same parameters and results, other speed and memory
    fused: str = setting("auto", one_of(FUSED), resumable=True)
    num_blks: int = setting(2, integer(1, 1024))
    dropout: float = setting(0.0, number(0, 1))  # none: the held-out loss tracks the training loss
    norm_first: bool = setting(True, boolean)  # pre-LN: trains at lr 1e-2; False: the book's post-LN
    activation: str = setting("relu", one_of(ACTIVATIONS))  # the FFN's nonlinearity; gelu: GPT's
    bias: bool = setting(True, boolean)  # biases in the FFN, the LayerNorms and the output layer
    tie_embeddings: bool = setting(False, boolean)  # the output layer reuses the token embedding (GPT-2)
    init: str = setting("d2l", one_of(INITS))  # gpt2: N(0, 0.02^2), residual projections / sqrt(2 num_blks)
    # the LM's learned position table holds lm_num_steps positions (--positional-opt max_len=N: N);
    # runs saved before this field built max(1000, lm_num_steps), and load so (model_max_len)
    lm_context_tables: bool = setting(True, boolean, legacy=False)
    # optimisation
    epochs: int = setting(4, integer(1, 1_000_000), resumable=True)
    steps: int | None = setting(None, optional(integer(1, 1 << 40)), resumable=True)  # instead of epochs
    batch_size: int = setting(128, integer(1))
    optimizer: str = setting("adam", one_of(OPTIMIZERS))
    lr: float = setting(1e-2, number(0, low_open=True, high=None))  # peak; pre-LN takes it (post-LN wants ~3e-3)
    weight_decay: float | None = setting(None, optional(number(0)))  # None: Adam 0, AdamW 0.01
    # AdamW decays every parameter (True: what runs before this field did), else only those of 2 or
    # more axes -- weight matrices and embedding tables, nanoGPT's rule -- and not biases or LayerNorm gains
    decay_all: bool = setting(False, boolean, legacy=True)
    betas: list | None = setting(None, optional(betas_pair))  # Adam's (beta1, beta2); None: (0.9, 0.999)
    min_lr: float = setting(0.0, number(0))  # where the cosine schedule ends
    schedule: str = setting("cosine", one_of(SCHEDULES))
    warmup_steps: int | None = setting(None, optional(integer(0, 1 << 40)))  # None: WARMUP_FRACTION of all steps
    label_smoothing: float = setting(0.0, number(0, 1))
    clip_grad_norm: float | None = setting(1.0, optional(number(0)))  # 0 or None: no clipping
    # running
    device: str = setting("cpu", identifier, resumable=True)
    # float32 matrix products on a GPU: "high" lets them use TF32 tensor cores (nanoGPT's train.py does),
    # "medium" bfloat16 ones; "highest" keeps float32 (mt.set_float32_matmul_precision); the CPU ignores it
    matmul_precision: str = setting("highest", one_of(PRECISIONS), resumable=True)
    # mixed precision (mt.autocast): products in bfloat16, softmaxes, norms, sums and the loss in float32, the
    # weights and the optimiser float32; training and the held-out loss, not generation
    autocast: bool = setting(False, boolean, resumable=True)
    # the forward and backward of each step captured once as a CUDA graph and replayed by one launch
    # (train/graphed.py): the same numbers, without the host's launch time; needs --device cuda
    cuda_graph: bool = setting(False, boolean, resumable=True)
    # processes training one model (data parallelism over MPI, train/distributed.py); a resumed
    # run may use another number: the global minibatches, and so the run, are the same
    workers: int = setting(1, integer(1, 4096), resumable=True)
    seed: int = setting(0, integer(0, 2**63 - 1))
    out: str = setting("runs/train", file_path)
    progress: bool = setting(True, boolean, resumable=True, flag="--no-progress")
    eval_batch_size: int = setting(500, integer(1))
    # every N steps, the mean loss of --eval-iters random minibatches of the training and the held-out
    # set ("step N: train loss X, val loss Y", nanoGPT's estimate); None: only the end of every epoch
    eval_interval: int | None = setting(None, optional(integer(1, 1 << 40)), resumable=True)
    eval_iters: int = setting(200, integer(1, 1_000_000), resumable=True)
    # a text LM's vocabulary: <pad>, <bos>, <eos>, <unk> and the characters, or the characters alone
    special_tokens: bool = setting(True, boolean, legacy=True)
    # the language model's tokens (--text): characters, or a byte-level BPE trained on the
    # training part of the text (data/bpe.py), of vocab_size tokens (None: BPE_VOCAB_SIZE)
    tokenizer: str = setting("char", one_of(TOKENIZERS))
    vocab_size: int | None = setting(None, optional(integer(257, 1 << 20)))

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d, where="config"):
        """A config from ``to_dict()``'s JSON (a checkpoint's copy), every field checked: an
        unknown key (a newer version's), or a value of the wrong type or out of range, is a
        ``ConfigError`` naming it. Missing keys take their defaults (an older version's)."""
        if not isinstance(d, dict):
            raise ConfigError(None, f"{where} must be a dict of settings, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(map(str, set(d) - names))
        if unknown:
            raise ConfigError(unknown[0], f"{where} has unknown field(s) {', '.join(unknown)[:200]}")
        legacy = {f.name: f.metadata["legacy"] for f in dataclasses.fields(cls) if "legacy" in f.metadata}
        config = cls(**{**{k: v for k, v in legacy.items() if k not in d}, **d})
        config.check_fields(where)
        return config

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def check_fields(self, where=None):
        """Each field's own check; ``where`` names the source in the message (a checkpoint's
        config), else the field's command-line flag does."""
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            value = getattr(self, f.name)
            problem = check(value) if check else None
            if problem:
                what = f"{where} field {f.name!r}" if where else flag_of(f.name)
                raise ConfigError(f.name, f"{what} {problem}, got {value!r:.80}")
        return self

    def validate(self):
        """All checks of a config about to train: each field's, the fields together, and
        that the data file is there."""
        self.check_fields()
        if self.model == "lm" and not self.text:
            raise ConfigError("model", "model 'lm' is a character language model: give a text file (--text FILE)")
        if self.text and self.model != "lm":
            raise ConfigError("model", "a text file (--text) trains a language model: use --model lm")
        if self.text and self.data:
            raise ConfigError(
                "data", "give either --data (a translation corpus) or --text (a text for a language model), not both"
            )
        if self.tokenizer == "bpe" and not self.text:
            raise ConfigError("tokenizer", "--tokenizer bpe tokenizes a text for a language model: give --text FILE")
        if self.vocab_size is not None and self.tokenizer != "bpe":
            raise ConfigError("vocab_size", "--vocab-size sets the size of a BPE vocabulary: add --tokenizer bpe")
        if self.min_lr > self.lr:  # the cosine would then raise the learning rate as the run goes on
            raise ConfigError(
                "min_lr",
                f"--min-lr {self.min_lr:g} is above --lr {self.lr:g}: the schedule decays from the peak --lr down "
                "to --min-lr; give a --min-lr at most --lr",
            )
        if self.text and self.lm_num_steps < 2:
            # generate continues a text in windows of lm_num_steps, each starting from half of the last
            raise ConfigError(
                "lm_num_steps",
                f"--lm-num-steps {self.lm_num_steps}: a language model's window must hold at least 2 tokens "
                "(generate continues a text window by window, each from half of the last)",
            )
        if self.min_len > self.max_len:
            raise ConfigError("min_len", f"--min-len {self.min_len} is above --max-len {self.max_len}")
        heldout_lens = (self.heldout_min_len, self.heldout_max_len)
        if heldout_lens != (None, None):
            if self.text or self.data or self.task not in ("reverse", "copy", "sort"):
                raise ConfigError(
                    "heldout_min_len",
                    "--heldout-min-len / --heldout-max-len set the held-out "
                    "lengths of the reverse, copy and sort tasks",
                )
            low, high = self.heldout_lengths()
            if low > high:
                raise ConfigError(
                    "heldout_min_len",
                    f"the held-out lengths {low}..{high} are empty: "
                    f"--heldout-min-len {low} is above --heldout-max-len {high}",
                )
        if self.num_kv_heads is not None and (self.model == "bahdanau" or self.num_heads % self.num_kv_heads):
            raise ConfigError(
                "num_kv_heads",
                f"--num-kv-heads {self.num_kv_heads} must divide --num-heads "
                f"{self.num_heads} (the query heads share key/value heads in "
                "equal groups) and needs a Transformer model",
            )
        if self.cuda_graph and self.device != "cuda":
            raise ConfigError(
                "cuda_graph", f"--cuda-graph captures a step's GPU kernels: it needs --device cuda, not {self.device!r}"
            )
        if self.cuda_graph and self.workers > 1:
            raise ConfigError(
                "cuda_graph",
                f"--cuda-graph replays one process's step: it takes one worker, not --workers {self.workers}",
            )
        if self.fused == "on" and self.model == "bahdanau":
            raise ConfigError(
                "fused",
                "--fused on streams multi-head attention, which the Bahdanau model (a GRU) has not: use --fused auto",
            )
        if self.model != "bahdanau" and self.num_hiddens % self.num_heads:
            raise ConfigError(
                "num_heads",
                f"--num-heads {self.num_heads} does not divide --num-hiddens "
                f"{self.num_hiddens}: each head gets num_hiddens / num_heads units",
            )
        from .. import plugins  # lazily: pluggy is imported when a config is checked, not by `minitensor --help`

        get_backend(self.device)  # a DeviceError naming what is missing, before anything is made
        for kind, plugin in (
            ("scorer", self.scorer),
            ("pooling", self.pooling),
            ("positional encoding", self.positional),
        ):
            if plugin is not None:
                plugins.lookup(kind, plugin)  # an unknown name lists the known ones
        if self.model != "bahdanau":
            try:
                split_positional(self.positional, self.input_positional, ("--positional ", "--input-positional "))
            except ValueError as e:
                raise ConfigError("input_positional", str(e)) from None
        elif self.input_positional is not None or self.positional_options:
            raise ConfigError("input_positional", "the Bahdanau model (a GRU) has no positional encoding")
        for key in ("data", "text"):
            file = getattr(self, key)
            if file is not None and not os.path.isfile(file):
                if os.path.isdir(file):
                    what = "the file is a folder, not a file"
                elif os.path.exists(file):  # /dev/zero, a pipe, a socket: no end to read to, or no size
                    what = "not a regular file (a device, a pipe or a socket); give a text file"
                else:
                    what = "the file does not exist"
                raise ConfigError(key, f"--{key} {file}: {what}")
        return self

    @classmethod
    def recipe(cls, model="transformer", preset=None, **changes):
        """The default config of ``model`` with ``changes``: the field defaults, except for the
        character LM, which has its own sizes (``LM_RECIPE``), and a ``preset`` (a name in
        ``PRESETS``), which sets its own fields. Giving ``epochs`` drops the recipe's
        ``steps``, so that the epochs asked for count."""
        base = dict(LM_RECIPE) if model == "lm" else {}
        if preset is not None:
            if preset not in PRESETS:
                raise ConfigError("preset", f"--preset {preset!r}: the presets are {', '.join(PRESETS)}")
            base = dict(PRESETS[preset])
            model = base.pop("model")
        if "epochs" in changes:
            base.pop("steps", None)
        return cls(model=model, **{**base, **changes})

    def heldout_lengths(self):
        """The shortest and longest held-out sequence of reverse/copy/sort."""
        low = self.min_len if self.heldout_min_len is None else self.heldout_min_len
        if self.heldout_max_len is not None:
            return low, self.heldout_max_len
        return low, max(self.max_len, low)  # only the shortest given: up to the training lengths' longest

    def setting(self, name):
        """The value of field ``name`` as the run uses it: the scorer's None is the model's
        default scorer (``scaled_dot``, ``additive`` for the Bahdanau model)."""
        return model_scorer(self) if name == "scorer" else getattr(self, name)

    @classmethod
    def resumable_fields(cls):
        """The fields a resumed run may change (``--resume --epochs 8``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("resumable"))

    @property
    def tokens(self):
        """How text becomes tokens: "word" for a corpus (D2L's preprocessing), "bpe" for a text
        with ``--tokenizer bpe``, else "char"."""
        return "word" if self.data else "bpe" if self.tokenizer == "bpe" else "char"

    @property
    def source_name(self):
        return self.text or self.data or f"{self.task} task"


# `minitensor train --text FILE`: a character LM with room for a few thousand words of English.
# On the example text (The Time Machine, 160,000 training characters) it ends ~46% below the
# unigram baseline in about two minutes on 2 CPU cores (the figures: bench/README.md); the held-out
# loss is still falling at the end, and longer runs overfit (best/ keeps the best epoch).
# eval_batch_size: a minibatch of windows at a time (500 windows of 128 held 1.1 GB of activations)
LM_RECIPE = dict(
    num_hiddens=128,
    ffn_num_hiddens=512,
    num_heads=4,
    num_blks=2,
    lm_num_steps=128,
    batch_size=16,
    steps=1000,
    lr=5e-3,
    eval_batch_size=16,
)


# nanoGPT's character-level Shakespeare (Karpathy, config/train_shakespeare_char.py and its README's
# CPU line): a GPT -- pre-LN blocks with GELU, learned positions, tied embeddings, no biases, GPT-2's
# init -- trained with AdamW (betas 0.9, 0.99; weight decay 0.1 on matrices and embeddings), 100 warm-up
# steps, cosine decay to lr / 10, gradients clipped at 1, on a vocabulary of the text's characters alone.
# `minitensor train --preset gpt-char` (the CPU recipe) or `--preset gpt-char-gpu` (the GPU one).
_GPT_CHAR = dict(
    model="lm",
    positional="learned",
    norm_first=True,
    activation="gelu",
    bias=False,
    tie_embeddings=True,
    init="gpt2",
    optimizer="adamw",
    weight_decay=0.1,
    decay_all=False,
    betas=[0.9, 0.99],
    lr=1e-3,
    min_lr=1e-4,
    schedule="cosine",
    warmup_steps=100,
    clip_grad_norm=1.0,
    label_smoothing=0.0,
    special_tokens=False,
    eval_interval=250,
    lm_sampling="random",
)
PRESETS = {
    # the README's CPU line: --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
    # --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0 --eval_iters=20
    "gpt-char": dict(
        _GPT_CHAR,
        num_hiddens=128,
        ffn_num_hiddens=4 * 128,
        num_heads=4,
        num_blks=4,
        lm_num_steps=64,
        batch_size=12,
        steps=2000,
        dropout=0.0,
        eval_iters=20,
        eval_batch_size=12,  # nanoGPT's: batch_size rows (500 windows of 64 would hold 570 MB of activations)
    ),
    # config/train_shakespeare_char.py as it stands: the "baby GPT" of 10.7M parameters, for a GPU
    "gpt-char-gpu": dict(
        _GPT_CHAR,
        num_hiddens=384,
        ffn_num_hiddens=4 * 384,
        num_heads=6,
        num_blks=6,
        lm_num_steps=256,
        batch_size=64,
        steps=5000,
        dropout=0.2,
        eval_iters=200,
        eval_batch_size=64,
        matmul_precision="high",  # train.py's torch.backends.cuda.matmul.allow_tf32 = True
    ),
}


def parse_options(items, what="option"):
    """``["k=v", ...]`` -> {k: v}, each value an int, else a float, else true/false/none,
    else the string: ``--scorer-opt num_hiddens=16 --scorer-opt temperature=0.5``."""
    options = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{what} {item!r}: expected key=value")
        options[key] = parse_value(text.strip())
    return options


def parse_value(text):
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    return text


# -- data -----------------------------------------------------------------------------------------
@dataclass
class TaskData:
    """What ``build_data`` returns. Seq2seq: ``train`` / ``heldout`` are (source tokens,
    target tokens) pairs. Language model: they are lists of token ids (one long text each)
    and ``src_vocab is tgt_vocab``."""

    train: list
    heldout: list
    src_vocab: object
    tgt_vocab: object
    num_steps: int  # source length (seq2seq) or window (LM)
    tgt_num_steps: int
    tokenizer: object = None  # the LM's ByteBPE (--tokenizer bpe), else None
    heldout_chars: int | None = None  # characters of the LM's held-out text (for the loss per character)


def build_data(config, vocabs=None, tokenizer=None):
    """Generate or read the data of ``config``, drawing from ``mt.random.host_rng()``
    (call ``mt.manual_seed`` first for a reproducible run). ``vocabs``: (src, tgt) to use
    instead of building them (a checkpoint's); ``tokenizer``: the ByteBPE of a BPE run to use
    instead of training one (a resumed run's)."""
    if config.text and config.tokenizer == "bpe":
        return _bpe_data(config, tokenizer)
    if config.text:
        vocab = vocabs[1] if vocabs else None
        corpus, vocab = char_lm_corpus(
            config.text, vocab=vocab, max_chars=config.max_examples, special_tokens=config.special_tokens
        )
        split = int(len(corpus) * (1 - config.heldout_fraction))
        if split <= config.lm_num_steps or len(corpus) - split <= config.lm_num_steps:
            raise ConfigError(
                "text",
                f"--text {config.text}: {len(corpus):,} characters are too few for a training "
                f"and a held-out part with windows of {config.lm_num_steps} characters "
                "(lower --lm-num-steps)",
            )
        n = config.lm_num_steps
        return TaskData(corpus[:split], corpus[split:], vocab, vocab, n, n, heldout_chars=len(corpus) - split)
    if config.data:
        pairs = read_parallel_corpus(config.data, max_examples=config.max_examples)
        train, heldout = train_heldout_split(pairs, heldout=config.heldout_fraction) if pairs else ([], [])
        if not train or not heldout:
            # refused now, not after an epoch of training without a held-out set
            raise ConfigError(
                "data",
                f"--data {config.data}: {len(pairs)} tab-separated sentence pairs leave "
                f"{len(train)} for training and {len(heldout)} held out "
                f"(--heldout-fraction {config.heldout_fraction:g}); give more pairs",
            )
    elif config.task == "date":
        train, heldout = date_task(config.num_train, config.num_heldout)
    else:
        make = {"reverse": reverse_task, "copy": copy_task, "sort": sort_task}[config.task]
        train = make(config.num_train, config.min_len, config.max_len)
        heldout = make(config.num_heldout, *config.heldout_lengths())
    src_vocab, tgt_vocab = vocabs if vocabs else build_vocabs(train)
    src_len, tgt_len = max_lengths(train + heldout)
    # + 1 for <eos>: every sequence keeps its end (see data.build_array)
    return TaskData(train, heldout, src_vocab, tgt_vocab, src_len + 1, tgt_len + 1)


def _bpe_data(config, tokenizer=None):
    """A text's language-model data in BPE tokens: the text is split by characters (the first
    ``1 - heldout_fraction`` for training), the tokenizer is trained on the training part alone
    (the held-out text must not shape the vocabulary it is scored in), and both parts are
    encoded. ``heldout_chars`` lets the loss be reported per character too."""
    text = read_text(config.text, max_chars=config.max_examples, what="text file")
    split = int(len(text) * (1 - config.heldout_fraction))
    train_text, heldout_text = text[:split], text[split:]
    if tokenizer is None:
        tokenizer = ByteBPE.train(train_text, config.vocab_size or BPE_VOCAB_SIZE)
    vocab = bpe_vocab(tokenizer, config.special_tokens)
    offset = len(vocab.reserved_tokens)  # token i of the tokenizer is index offset + i of the model
    train = [offset + i for i in tokenizer.encode(train_text)]
    heldout = [offset + i for i in tokenizer.encode(heldout_text)]
    n = config.lm_num_steps
    if len(train) <= n or len(heldout) <= n:
        raise ConfigError(
            "text",
            f"--text {config.text}: {len(train):,} training and {len(heldout):,} held-out BPE tokens are too few "
            f"for windows of {n} tokens (lower --lm-num-steps)",
        )
    return TaskData(train, heldout, vocab, vocab, n, n, tokenizer=tokenizer, heldout_chars=len(heldout_text))


def bpe_vocab(tokenizer, special_tokens=True):
    """The model's Vocab of a ByteBPE: the reserved tokens (unless ``special_tokens`` is False,
    as in nanoGPT's recipe), then every BPE token in id order, written as GPT-2's printable
    symbols ("Ġthe"). No symbol is "<pad>" or another reserved token: "<", ">" and letters never
    share a BPE token (they are in different chunks)."""
    reserved = list(RESERVED_TOKENS) if special_tokens else []
    return Vocab.from_dict({"idx_to_token": reserved + tokenizer.token_symbols(), "reserved_tokens": reserved})


def load_tokenizer(run_dir, config, vocab=None):
    """The ByteBPE a BPE run saved in its folder (``TOKENIZER_FILE``), checked against the
    checkpoint's ``vocab`` when given: the same tokens in the same order."""
    path = os.path.join(run_dir, TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: missing; this run was trained with --tokenizer {config.tokenizer} and keeps its tokenizer there"
        )
    tokenizer = ByteBPE.load(path)
    if vocab is not None and vocab.idx_to_token != bpe_vocab(tokenizer, config.special_tokens).idx_to_token:
        raise ValueError(f"{path}: its {len(tokenizer)} tokens are not those of the checkpoint's vocabulary")
    return tokenizer


def loss_per_char(loss, num_tokens, num_chars):
    """A loss in nats per token as nats per character: total nats / characters, i.e.
    ``loss * num_tokens / num_chars`` for a text of ``num_tokens`` tokens and ``num_chars``
    characters. It is what compares a BPE model with a character model (whose two are equal);
    per token, a model over longer tokens has more to predict each time."""
    return loss * num_tokens / num_chars


# -- the model ------------------------------------------------------------------------------------
def model_scorer(config):
    """The scorer the run uses: ``config.scorer``, else the model's default (the engine's
    ``Seq2SeqConfig.scorer`` for the Bahdanau model, ``TransformerConfig.scorer`` otherwise)."""
    return config.scorer or (Seq2SeqConfig.scorer if config.model == "bahdanau" else TransformerConfig.scorer)


def model_fused(config):
    """The models' ``fused`` argument for ``config.fused``: "on" -> True, "off" -> False, "auto"."""
    return {"on": True, "off": False}.get(config.fused, "auto")


def model_max_len(config):
    """The positions the models' tables hold. A language model's *learned* table (nanoGPT's
    ``wpe``) holds its context, ``lm_num_steps`` rows: positions past it are never trained. A
    table computed from a formula (sinusoidal, rotary, a score bias) keeps the models' default,
    1000 positions (at least the context), so that the model can be read past the length it was
    trained on (the length-extrapolation experiment, an ONNX export with a longer window). Runs
    saved before ``lm_context_tables`` built the default for every table, and load so.
    ``--positional-opt max_len=N`` sets an "inputs" encoding's table itself."""
    longest = max(TransformerConfig.max_len, config.lm_num_steps)
    if config.model != "lm" or not config.lm_context_tables:
        return longest if config.model == "lm" else TransformerConfig.max_len
    learned = "learned" in (config.positional, config.input_positional)
    return config.lm_num_steps if learned else longest


def model_config(config, vocab_size):
    """The architecture ``config`` describes, as the engine's model config: a
    ``Seq2SeqConfig`` for the Bahdanau model (a GRU of ``num_blks`` layers, embed size =
    num_hiddens), a ``TransformerConfig`` otherwise; ``vocab_size`` is the vocabulary of the
    part it builds (the encoder's source, the decoder's target)."""
    c = config
    attention = dict(
        scorer=model_scorer(c),
        pooling=c.pooling,
        scorer_options=dict(c.scorer_options) or None,
        pooling_options=dict(c.pooling_options) or None,
    )
    if c.model == "bahdanau":
        return Seq2SeqConfig(vocab_size, c.num_hiddens, c.num_hiddens, c.num_blks, c.dropout, **attention)
    if c.model not in ("lm", "transformer"):
        raise ValueError(f"model must be one of {MODELS}, got {c.model!r}")
    sizes = (vocab_size, c.num_hiddens, c.ffn_num_hiddens, c.num_heads, c.num_blks, c.dropout)
    return TransformerConfig(
        *sizes,
        # positional tables long enough for the LM's windows (at least the models' default)
        max_len=model_max_len(c),
        positional=c.positional,
        positional_options=dict(c.positional_options) or None,
        input_positional=c.input_positional,
        norm_first=c.norm_first,
        num_kv_heads=c.num_kv_heads,
        fused=model_fused(c),
        activation=c.activation,
        bias=c.bias,
        tie_embeddings=c.tie_embeddings,
        init=c.init,
        **attention,
    )


def build_model(config, src_vocab, tgt_vocab):
    """The model ``config`` describes, freshly initialised (from the backend's generator,
    which ``mt.manual_seed`` seeds), on ``config.device``.

    - "transformer": ``EncoderDecoder(TransformerEncoder, TransformerDecoder)`` (D2L 11.7);
    - "bahdanau": ``Seq2Seq(Seq2SeqEncoder, Seq2SeqAttentionDecoder)``, a GRU of
      ``num_blks`` layers with additive attention (D2L 11.4; embed size = num_hiddens);
    - "lm": ``TransformerLM`` over ``tgt_vocab`` (decoder blocks only).

    Each model is built from ``model_config``, which the model keeps as ``model.config``.
    """
    c = config
    if c.model == "bahdanau":
        encoder = Seq2SeqEncoder(len(src_vocab), c.num_hiddens, c.num_hiddens, c.num_blks, c.dropout, device=c.device)
        decoder = Seq2SeqAttentionDecoder(model_config(c, len(tgt_vocab)), device=c.device)
        return Seq2Seq(encoder, decoder)
    try:
        if c.model == "lm":
            return TransformerLM(model_config(c, len(tgt_vocab)), device=c.device)
        encoder = TransformerEncoder(model_config(c, len(src_vocab)), device=c.device)
        decoder = TransformerDecoder(model_config(c, len(tgt_vocab)), device=c.device)
    except ValueError as e:  # the attention cannot stream (its scorer, pooling or score bias): name the flag
        prefix = "MultiHeadAttention(fused=True): "
        if c.fused == "on" and str(e).startswith(prefix):
            raise ConfigError("fused", f"--fused on: {str(e).removeprefix(prefix)}; use --fused auto") from None
        raise
    return EncoderDecoder(encoder, decoder)


def min_num_parameters(config, src_vocab_size, tgt_vocab_size):
    """A lower bound on the parameters ``build_model`` would allocate, from the config alone:
    the embeddings, the output layer and the blocks' weight matrices (a plugin may add more).
    A checkpoint's weights are compared with it *before* the model is built, so an edited
    config cannot make the loader allocate a model far larger than the file it came with."""
    c, h = config, config.num_hiddens
    if c.model == "bahdanau":  # embeddings, a GRU layer's input and hidden weights, the output layer
        return (src_vocab_size + 2 * tgt_vocab_size) * h + c.num_blks * 2 * 3 * h * h
    kv = h // c.num_heads * (c.num_kv_heads or c.num_heads)  # the K and V heads (fewer when grouped)
    attention = 2 * h * h + 2 * h * kv  # W_q, W_o, W_k, W_v
    block = attention + 2 * h * c.ffn_num_hiddens  # and the FFN
    # the token embedding and the output layer, one Parameter when tied
    decoder_ends = (1 if c.tie_embeddings else 2) * tgt_vocab_size * h
    if c.model == "lm":
        return decoder_ends + c.num_blks * block
    encoder = src_vocab_size * h + c.num_blks * block
    decoder = decoder_ends + c.num_blks * (block + attention)  # + cross-attention, grouped as well
    return encoder + decoder


MODEL_NAMES = {"transformer": "an encoder-decoder Transformer", "bahdanau": "a Bahdanau GRU", "lm": "a language model"}
TRAINING_BYTES_PER_PARAMETER = 4 * 4  # float32: the weight, its gradient and Adam's two moments


def check_fits_device(config, src_vocab_size, tgt_vocab_size):
    """Refuse, before ``build_model`` allocates anything, a model whose training cannot fit the
    device's memory (``Backend.memory_size``): its weights, gradients and Adam's moments alone,
    ``min_num_parameters`` x 16 bytes, a floor under what the run needs (activations come on
    top). A mistyped size (``--num-hiddens 30000``) is then an error naming the sizes, not a
    machine swapping or a process killed by the system for memory."""
    memory = get_backend(config.device).memory_size()
    parameters = min_num_parameters(config, src_vocab_size, tgt_vocab_size)
    needed = parameters * TRAINING_BYTES_PER_PARAMETER
    if memory is not None and needed > memory:
        sizes = ", ".join(
            f"{flag_of(name)} {getattr(config, name)}"
            for name in ("num_hiddens", "ffn_num_hiddens", "num_blks")
            if not (name == "ffn_num_hiddens" and config.model == "bahdanau")
        )
        raise ConfigError(
            "num_hiddens",
            f"{sizes}: {MODEL_NAMES[config.model]} of at least {parameters:,} parameters; training keeps "
            f"each as float32 four times (weight, gradient, Adam's two moments), at least "
            f"{needed / 2**30:,.1f} GiB, more than the {memory / 2**30:,.1f} GiB of device "
            f"{config.device!r}",
        )


def build_optimizer(config, model):
    """Adam or AdamW at ``lr`` with ``betas`` and ``weight_decay`` (None: the optimiser's default).

    AdamW's decay goes, unless ``decay_all``, only to the parameters of two or more axes -- the
    weight matrices and the embedding tables (token and learned positions, as nanoGPT decays
    them) -- in one parameter group; biases and LayerNorm gains (one axis) form a second group
    without decay: shrinking a gain towards 0 or a bias towards 0 is no regularisation of the
    function's complexity, only a pull away from the normalisation's identity."""
    cls = optim.AdamW if config.optimizer == "adamw" else optim.Adam
    kwargs = {"lr": config.lr}
    if config.weight_decay is not None:
        kwargs["weight_decay"] = config.weight_decay
    if config.betas is not None:
        kwargs["betas"] = tuple(config.betas)
    if config.optimizer == "adamw" and not config.decay_all:
        return cls(weight_decay_groups(model), **kwargs)
    return cls(model.parameters(), **kwargs)


def weight_decay_groups(model):
    """[{"params": the parameters of 2+ axes}, {"params": the others, "weight_decay": 0.0}]: the
    first group takes the optimiser's weight decay, the second none (empty groups left out)."""
    params = list(model.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay}] if decay else []
    return groups + ([{"params": no_decay, "weight_decay": 0.0}] if no_decay else [])


def build_scheduler(config, optimizer, total_steps):
    """Warm-up then cosine decay to ``min_lr`` (default 0), the Noam schedule, or none. The warm-up lasts
    ``warmup_steps``, else ``WARMUP_FRACTION`` of the steps."""
    warmup = config.warmup_steps if config.warmup_steps is not None else max(1, int(total_steps * WARMUP_FRACTION))
    if config.schedule == "constant":
        return None
    if config.schedule == "noam":
        # peak at lr: factor chosen so that lr_at(warmup) == config.lr
        return optim.NoamLR(
            optimizer,
            config.num_hiddens,
            max(1, warmup),
            factor=config.lr * (config.num_hiddens * max(1, warmup)) ** 0.5,
        )
    if total_steps == 1:  # see cosine_end: the one step is a warm-up's last, at the peak lr
        return optim.WarmupCosineLR(optimizer, 1, cosine_end(total_steps), min_lr=config.min_lr)
    return optim.WarmupCosineLR(optimizer, min(warmup, total_steps - 1), total_steps, min_lr=config.min_lr)


def cosine_end(total_steps):
    """The step at which a run of ``total_steps`` ends its cosine schedule: ``total_steps``, and
    2 for a run of one step. WarmupCosineLR spends step ``total_steps`` at min_lr (0 by default)
    and a warm-up must end before it, so a single step would train nothing; a one-step warm-up
    before a decay at step 2 makes the run's only step the warm-up's last, at the peak lr (as
    the first step of PyTorch's CosineAnnealingLR is), and a resumed run stretches the decay."""
    return max(total_steps, 2)


def tokenize_text(config, text, tokenizer=None):
    """A line the user typed as the model's source tokens (``tokenizer``: a BPE run's ByteBPE)."""
    return tokenize_line(config.tokens, text, tokenizer)


def tokenize_line(kind, text, tokenizer=None):
    """``text`` as tokens of ``kind``: "word" (D2L's preprocessing, then words), "bpe" (the
    symbols of ``tokenizer``'s tokens, as its Vocab holds them) or "char"."""
    if kind == "bpe":
        symbols = tokenizer.token_symbols()
        return [symbols[i] for i in tokenizer.encode(text)]
    return tokenize(preprocess(text)) if kind == "word" else list(text)


def detokenize(config, tokens):
    if config.tokens == "bpe":
        return symbols_to_text(tokens)
    return (" " if config.tokens == "word" else "").join(tokens)
