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
from dataclasses import dataclass, field
from typing import Optional

TASKS = ("date", "reverse", "copy", "sort")
MODELS = ("transformer", "bahdanau", "lm")
SCHEDULES = ("cosine", "noam", "constant")
OPTIMIZERS = ("adam", "adamw")


@dataclass
class TrainConfig:
    """Everything a run depends on. Defaults: D2L's small Transformer (11.7.6: num_hiddens
    32, ffn_num_hiddens 64, 4 heads, 2 + 2 blocks) learning date normalisation on the CPU
    in a few minutes, with pre-LayerNorm blocks, no dropout and a peak lr of 1e-2 (warm-up,
    then cosine decay): ~100% held-out exact match after 4 epochs, where the book's post-LN
    recipe (``norm_first=False, dropout=0.1, lr=3e-3``) reaches ~66%."""

    # data: a generated task, or a tab-separated corpus (``data``), or a text for a char LM
    task: str = "date"
    data: Optional[str] = None
    text: Optional[str] = None
    num_train: int = 20_000          # generated training examples (date/reverse/copy/sort)
    num_heldout: int = 1_000         # held-out examples (dates disjoint from training dates)
    min_len: int = 1                 # sequence lengths of reverse/copy/sort
    max_len: int = 10
    max_examples: Optional[int] = None  # first lines of a corpus; characters of a text
    heldout_fraction: float = 0.1    # of a corpus or a text
    lm_num_steps: int = 64           # window of the character LM
    # model
    model: str = "transformer"
    scorer: Optional[str] = None     # None: scaled_dot (Transformer), additive (Bahdanau)
    pooling: str = "softmax"
    positional: str = "sinusoidal"
    scorer_options: dict = field(default_factory=dict)
    pooling_options: dict = field(default_factory=dict)
    num_hiddens: int = 32
    ffn_num_hiddens: int = 64
    num_heads: int = 4
    num_blks: int = 2
    dropout: float = 0.0             # none: on the date task the held-out loss tracks the training loss
    norm_first: bool = True          # pre-LN: trains at lr 1e-2; False is the book's post-LN
    # optimisation
    epochs: int = 4
    steps: Optional[int] = None      # if set: train this many steps (epochs follow from it)
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-2                 # peak; pre-LN takes it (post-LN wants ~3e-3)
    weight_decay: Optional[float] = None  # None: the optimiser's default (Adam 0, AdamW 0.01)
    schedule: str = "cosine"
    warmup_steps: Optional[int] = None  # None: 5% of all steps (at least 1)
    label_smoothing: float = 0.0
    clip_grad_norm: Optional[float] = 1.0
    # running
    device: str = "cpu"
    seed: int = 0
    out: str = "runs/train"
    progress: bool = True
    eval_batch_size: int = 500

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        """A config from ``to_dict()``'s JSON; unknown keys (a newer version's) are an error
        that names them rather than a silent loss."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown fields {unknown}")
        return cls(**d)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def validate(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.model == "lm" and not self.text:
            raise ValueError("model 'lm' is a character language model: give a text file (--text FILE)")
        if self.text and self.model != "lm":
            raise ValueError("a text file (--text) trains a language model: use --model lm")
        if self.data is None and self.text is None and self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.epochs < 1 and not self.steps:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        return self

    @property
    def tokens(self):
        """How text becomes tokens: "word" for a corpus (D2L's preprocessing), else "char"."""
        return "word" if self.data else "char"

    @property
    def source_name(self):
        return self.text or self.data or f"{self.task} task"


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
    num_steps: int       # source length (seq2seq) or window (LM)
    tgt_num_steps: int


def build_data(config, vocabs=None):
    """Generate or read the data of ``config``, drawing from ``mt.random.host_rng()``
    (call ``mt.manual_seed`` first for a reproducible run). ``vocabs``: (src, tgt) to use
    instead of building them (a checkpoint's)."""
    from ..data import (build_vocabs, char_lm_corpus, copy_task, date_task, max_lengths, read_parallel_corpus,
                        reverse_task, sort_task, train_heldout_split)

    if config.text:
        vocab = vocabs[1] if vocabs else None
        corpus, vocab = char_lm_corpus(config.text, vocab=vocab, max_chars=config.max_examples)
        split = int(len(corpus) * (1 - config.heldout_fraction))
        if split <= config.lm_num_steps or len(corpus) - split <= config.lm_num_steps:
            raise ValueError(f"{config.text}: {len(corpus)} characters are too few for windows of "
                             f"{config.lm_num_steps} (lower --lm-num-steps)")
        return TaskData(corpus[:split], corpus[split:], vocab, vocab, config.lm_num_steps, config.lm_num_steps)
    if config.data:
        pairs = read_parallel_corpus(config.data, max_examples=config.max_examples)
        if len(pairs) < 2:
            raise ValueError(f"{config.data}: found {len(pairs)} tab-separated sentence pairs; need at least 2")
        train, heldout = train_heldout_split(pairs, heldout=config.heldout_fraction)
    elif config.task == "date":
        train, heldout = date_task(config.num_train, config.num_heldout)
    else:
        make = {"reverse": reverse_task, "copy": copy_task, "sort": sort_task}[config.task]
        train = make(config.num_train, config.min_len, config.max_len)
        heldout = make(config.num_heldout, config.min_len, config.max_len)
    src_vocab, tgt_vocab = vocabs if vocabs else build_vocabs(train)
    src_len, tgt_len = max_lengths(train + heldout)
    # + 1 for <eos>: every sequence keeps its end (see data.build_array)
    return TaskData(train, heldout, src_vocab, tgt_vocab, src_len + 1, tgt_len + 1)


# -- the model ------------------------------------------------------------------------------------
def model_scorer(config):
    return config.scorer or ("additive" if config.model == "bahdanau" else "scaled_dot")


def build_model(config, src_vocab, tgt_vocab):
    """The model ``config`` describes, freshly initialised (from the backend's generator,
    which ``mt.manual_seed`` seeds), on ``config.device``.

    - "transformer": ``EncoderDecoder(TransformerEncoder, TransformerDecoder)`` (D2L 11.7);
    - "bahdanau": ``Seq2Seq(Seq2SeqEncoder, Seq2SeqAttentionDecoder)``, a GRU of
      ``num_blks`` layers with additive attention (D2L 11.4; embed size = num_hiddens);
    - "lm": ``TransformerLM`` over ``tgt_vocab`` (decoder blocks only).
    """
    from ..nn.seq2seq import Seq2Seq, Seq2SeqAttentionDecoder, Seq2SeqEncoder
    from ..nn.transformer import EncoderDecoder, TransformerDecoder, TransformerEncoder, TransformerLM

    c = config
    attention = dict(scorer=model_scorer(c), pooling=c.pooling, scorer_options=dict(c.scorer_options) or None,
                     pooling_options=dict(c.pooling_options) or None)
    if c.model == "bahdanau":
        encoder = Seq2SeqEncoder(len(src_vocab), c.num_hiddens, c.num_hiddens, c.num_blks, c.dropout,
                                 device=c.device)
        decoder = Seq2SeqAttentionDecoder(len(tgt_vocab), c.num_hiddens, c.num_hiddens, c.num_blks, c.dropout,
                                          device=c.device, **attention)
        return Seq2Seq(encoder, decoder)
    shared = dict(positional=c.positional, norm_first=c.norm_first, device=c.device, **attention)
    if c.model == "lm":
        return TransformerLM(len(tgt_vocab), c.num_hiddens, c.ffn_num_hiddens, c.num_heads, c.num_blks, c.dropout,
                             **shared)
    if c.model != "transformer":
        raise ValueError(f"model must be one of {MODELS}, got {c.model!r}")
    encoder = TransformerEncoder(len(src_vocab), c.num_hiddens, c.ffn_num_hiddens, c.num_heads, c.num_blks,
                                 c.dropout, **shared)
    decoder = TransformerDecoder(len(tgt_vocab), c.num_hiddens, c.ffn_num_hiddens, c.num_heads, c.num_blks,
                                 c.dropout, **shared)
    return EncoderDecoder(encoder, decoder)


def build_optimizer(config, model):
    from .. import optim

    cls = optim.AdamW if config.optimizer == "adamw" else optim.Adam
    kwargs = {"lr": config.lr}
    if config.weight_decay is not None:
        kwargs["weight_decay"] = config.weight_decay
    return cls(model.parameters(), **kwargs)


def build_scheduler(config, optimizer, total_steps):
    """Warm-up then cosine decay to 0 (default), the Noam schedule, or none."""
    from .. import optim

    warmup = config.warmup_steps if config.warmup_steps is not None else max(1, total_steps // 20)
    if config.schedule == "constant":
        return None
    if config.schedule == "noam":
        # peak at lr: factor chosen so that lr_at(warmup) == config.lr
        return optim.NoamLR(optimizer, config.num_hiddens, max(1, warmup),
                            factor=config.lr * (config.num_hiddens * max(1, warmup)) ** 0.5)
    return optim.WarmupCosineLR(optimizer, min(warmup, total_steps - 1), total_steps)


def tokenize_text(config, text):
    """A line the user typed as the model's source tokens."""
    if config.tokens == "word":
        from ..data import preprocess, tokenize

        return tokenize(preprocess(text))
    return list(text)


def detokenize(config, tokens):
    return (" " if config.tokens == "word" else "").join(tokens)
