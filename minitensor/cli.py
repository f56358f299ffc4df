"""The ``minitensor`` command line.

Every subcommand reports an expected error as one line on stderr, never a traceback, and
exits with 2 for bad input or usage (a wrong flag, a missing file, an occupied run folder, a
damaged checkpoint), 1 for a run that failed (the loss diverged, the disk is full) and 130
for Ctrl-C (after the last checkpoint is safe). A closed stdout (``| head``) ends quietly,
with 141 as a process ended by SIGPIPE. ``--debug`` or ``MINITENSOR_DEBUG=1`` shows
the traceback instead. ``--plugin PATH_OR_MODULE`` loads a plugin for that one command.
"""

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
import warnings

import minitensor as mt

from . import demo, errors
from .data.bpe import symbol_text
from .data.tasks import TEXTS
from .inference import SAMPLE_TEMPERATURE, generate, translate
from .nn import Seq2SeqConfig, TransformerConfig
from .precision import PRECISIONS
from .train.checkpoint import CheckpointError, find_checkpoint, load_checkpoint
from .train.config import (
    ACTIVATIONS,
    BPE_VOCAB_SIZE,
    FUSED,
    INITS,
    LM_RECIPE,
    MODELS,
    OPTIMIZERS,
    PRESETS,
    SCHEDULES,
    TASKS,
    TOKENIZERS,
    WARMUP_FRACTION,
    ConfigError,
    TrainConfig,
    build_model,
    detokenize,
    flag_of,
    load_tokenizer,
    parse_options,
    tokenize_line,
    tokenize_text,
)
from .train.distributed import (
    DIST_EXTRA,
    OVERSUBSCRIBE_FACTOR,
    DistributedError,
    check_local_workers,
    check_workers,
    import_mpi,
    launched_rank,
    launched_size,
    usable_cpus,
    world,
)
from .train.loop import TrainingError, train
from .train.plots import plot_cross_attention, plot_seq2seq_attention
from .train.run import BEST_DIR, CHECKPOINT_DIR, has_checkpoint, load_run_checkpoint, nothing_to_resume

# `minitensor.plugins` is imported inside the functions that use it: it imports pluggy, which
# `minitensor --help` never needs.

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141
_LAST_WORDS_S = 0.25  # a failing rank's pause before the job ends: see _end_job


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the whole usage first), and says
    whose help to read."""

    def error(self, message):
        # argparse's word for a value given to a flag that takes none reads as if it were dropped
        message = message.replace("ignored explicit argument", "takes no value, got")
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # argparse reports a subcommand's stray words from the top parser ("see minitensor
        # --help"); the subcommand's help is the one that lists what it takes
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            self.exit(EXIT_USAGE, f"{prog}: error: unrecognized arguments: {' '.join(extras)} (see {prog} --help)\n")
        return parsed


# -- argument types: refused by the parser, before anything runs -----------------------------------
def _at_least(low, high=None, why=""):
    """An integer >= ``low`` (and <= ``high``, where ``why`` says where that bound comes from)."""

    def convert(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}{why}, got {value}")
        return value

    return convert


# The widest --beam. Every decoding step holds (examples x beam x vocabulary) scores and the model's
# cache for every beam row, so the width is bounded before anything is allocated: a mistyped
# --beam 100000000 grew to 12 GB. Beams in use are 4 to 10 (D2L, fairseq, Hugging Face's examples)
# and wider ones translate worse, not better (Koehn and Knowles, "Six Challenges for Neural Machine
# Translation", 2017); 256 leaves room for experiments far past that. (The Python searches take any
# width whose scores fit the memory, for exhaustive search on a small vocabulary.)
MAX_BEAM_SIZE = 256
MAX_NEW_TOKENS = 1_000_000  # --max-len: the text, and a cache without a window, grow with every token
_beam_width = _at_least(1, MAX_BEAM_SIZE, " (each step holds K times the scores and caches; beams in use are 4 to 10)")
_new_tokens = _at_least(1, MAX_NEW_TOKENS, " (the text, and a key/value cache without a window, grow with every token)")


def _betas(text):
    """``--betas 0.9,0.99`` -> [0.9, 0.99]."""
    try:
        betas = [float(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers, e.g. 0.9,0.99, got {text!r}") from None
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise argparse.ArgumentTypeError(f"expected two numbers in [0, 1), e.g. 0.9,0.99, got {text!r}")
    return betas


def _path(text):
    """A file or folder given on the command line: an empty one is refused, not read as "no
    path" (``--out "$RUN"`` with RUN unset would otherwise write into the default folder)."""
    if not text:
        raise argparse.ArgumentTypeError('the path is empty (an unset shell variable, as in "$RUN"?)')
    return text


def _positive_number(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


# -- subcommands ------------------------------------------------------------------------------------
def _info(args):
    print(f"minitensor {mt.__version__}")
    print(f"devices: {', '.join(mt.available_backends())}")
    reason = mt.cuda.unavailable_reason()
    if reason is not None:
        print(f"cuda: not available ({reason})")
        return 0
    from .backends.cupy_backend import cuda_summary

    try:  # CuPy sees a GPU; can it run a kernel and load cuBLAS and cuRAND there?
        backend = mt.get_backend("cuda")
    except mt.DeviceError as e:
        print(f"cuda: FAILED: {e}")
        return 1
    print(f"cuda: available ({cuda_summary(backend.xp)})")
    try:  # the kernels compile with NVRTC on first use: check now, not in the middle of training
        names = backend.kernels.compile_all()
        print(f"cuda kernels: {len(names)} compiled (minitensor/core/kernels/cuda/*.cu, by NVRTC through CuPy)")
    except mt.DeviceError as e:
        print(f"cuda kernels: FAILED: {e}")
        return 1
    try:  # a CUDA graph's products call cuBLAS directly (CuPy refuses to inside a capture)
        print(f"cuda graphs: ready (cuBLAS reached directly: {backend.direct_cublas().name})")
    except Exception as e:  # optional: only --cuda-graph needs it
        print(f"cuda graphs: not available ({type(e).__name__}: {e}); train without --cuda-graph")
    return 0


def _plugins(args):
    """List every plugin class (scorers, poolings, positional encodings, cache policies, decoders)
    with its kind and the plugin it comes from."""
    from . import plugins  # lazily: see the note under the imports

    rows = plugins.describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    decoders = plugins.decoders()
    for row in rows:  # where a positional encoding acts: "positional encoding (scores)"
        if "applies_to" in row:
            row["kind"] = f"{row['kind']} ({row['applies_to']})"
        elif row["kind"] == "decoder":  # "decoder (processor)" or "decoder (search)"
            row["kind"] = f"decoder ({getattr(decoders[row['name']], 'kind', '?')})"
    columns = [("name", "NAME"), ("kind", "KIND"), ("source", "SOURCE")]
    if args.verbose:
        columns.append(("class", "CLASS"))
    # every column as wide as its widest cell, so the table lines up
    widths = [max([len(title)] + [len(row[key]) for row in rows]) for key, title in columns]
    for cells in [[title for _, title in columns]] + [[row[key] for key, _ in columns] for row in rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip())
    return 0


def _demo(args):
    return demo.main(args)


# -- train ------------------------------------------------------------------------------------------
# `minitensor train --field-name VALUE` sets the TrainConfig field `field_name`: every field has
# the flag of its own name, except these, each set another way or on purpose not at all. A new
# field needs either a flag of its name (in _add_train_parser) or a line here; tests/test_cli.py
# fails until it has one or the other.
_PLUGIN_OPTIONS = ("scorer_options", "pooling_options", "positional_options")  # --scorer-opt K=V ... -> a dict
_NOT_SET_BY_OWN_FLAG = {
    **{name: f"{flag_of(name)} KEY=VALUE, repeatable" for name in _PLUGIN_OPTIONS},
    "progress": "--no-progress sets it to False",
    "out": "--out, or runs/<task> without it (default_out): where the run lives, not a setting",
    "eval_batch_size": None,  # no flag: how many held-out examples are evaluated at once (the Python API's)
    # no flag: False only in configs saved before it (positional tables of max(1000, lm_num_steps) rows);
    # --positional-opt max_len=N sets a table's length
    "lm_context_tables": None,
}
# the fields set by the flag of their own name, in TrainConfig's order
_OWN_FLAG_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name not in _NOT_SET_BY_OWN_FLAG)


def _options(items, what):
    try:
        return parse_options(items, what)
    except ValueError as e:
        raise ConfigError(what, str(e)) from None


def explicit_settings(args):
    """The TrainConfig fields the user set on the command line ({field: value}), and only
    those: a resumed run compares exactly these with the saved ones."""
    given = {name: getattr(args, name) for name in _OWN_FLAG_FIELDS if getattr(args, name) is not None}
    for name in ("data", "text"):  # a run must find its data from any directory, e.g. on --resume
        if name in given:
            given[name] = os.path.abspath(given[name])
    if args.no_progress:
        given["progress"] = False
    for name in _PLUGIN_OPTIONS:
        flag = flag_of(name)  # "--scorer-opt", argparse's args.scorer_opt
        items = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if items:
            given[name] = _options(items, flag)
    if args.text and "model" not in given:
        given["model"] = "lm"
    return given


def default_out(args):
    """Where a run goes without --out: runs/<task>, runs/lm for a text, runs/corpus for --data."""
    if args.out:
        return args.out
    if args.text:
        return "runs/lm"
    if args.preset:
        return f"runs/{args.preset}"
    return "runs/corpus" if args.data else f"runs/{args.task or TrainConfig.task}"


def config_from_args(args):
    """A TrainConfig from ``minitensor train``'s arguments (flags left out keep the defaults,
    the model's: a character LM has its own sizes)."""
    given = explicit_settings(args)
    if args.preset:
        given.setdefault("text", os.path.abspath(TEXTS["tinyshakespeare"]))  # the text shipped for the presets
        given.pop("model", None)  # --text's "lm": the preset's own
    return TrainConfig.recipe(given.pop("model", TrainConfig.model), args.preset, out=default_out(args), **given)


# The Bahdanau model is D2L's GRU encoder-decoder: it reads num_hiddens, num_blks and dropout, and
# none of these (--num-kv-heads and --input-positional are refused by TrainConfig.validate).
_TRANSFORMER_ONLY = (
    "positional",
    "num_heads",
    "ffn_num_hiddens",
    "norm_first",
    "activation",
    "bias",
    "tie_embeddings",
    "init",
)


def _flag_with_value(name, value):
    """'--num-train 5', '--no-special-tokens': a setting as the user typed it."""
    flag = flag_of(name)
    if isinstance(value, bool):
        return flag if value else "--no-" + flag.removeprefix("--")
    return f"{flag} {value}"


def _refuse_unused_flags(config, given):
    """Refuse flags given on the command line (``given``: only those) that the run would ignore:
    a generated task's on a text or a corpus, a language model's on a task, a Transformer's on
    the Bahdanau model. Checked on what the user typed, not on the config: a config made in
    Python (``config.replace(model="bahdanau")``) may carry settings another model reads."""
    generated = not (config.text or config.data)
    source = "--text FILE (a language model's text)" if config.text else "--data FILE (a corpus)"
    rules = (  # (the settings, whether this run ignores them, whose settings they are)
        (
            ("task", "num_train", "num_heldout", "min_len", "max_len"),
            not generated,
            f"a generated task, which {source} replaces",
        ),
        (
            ("min_len", "max_len"),
            generated and config.task == "date",
            "the reverse, copy and sort tasks, not the date task",
        ),
        (
            ("lm_num_steps", "lm_sampling", "special_tokens"),
            not config.text,
            "a language model, which --text FILE trains",
        ),
        (("heldout_fraction", "max_examples"), generated, "a corpus (--data FILE) or a text (--text FILE)"),
        (
            _TRANSFORMER_ONLY,
            config.model == "bahdanau",
            "the Transformer: the Bahdanau model (a GRU with additive attention) has no positional encoding, "
            "heads or feed-forward blocks",
        ),
    )
    for names, ignored, whose in rules:
        unused = [name for name in names if ignored and name in given]
        if unused:
            typed = ", ".join(_flag_with_value(name, given[name]) for name in unused)
            what, them = ("are settings", "them") if len(unused) > 1 else ("is a setting", "it")
            raise ConfigError(unused[0], f"{typed} {what} of {whose}; leave {them} out")


def _preset_settings(name):
    """The fields ``--preset NAME`` sets, as a new run would take them (its text: the one shipped)."""
    return {"text": os.path.abspath(TEXTS["tinyshakespeare"]), **PRESETS[name]}


def _resumable_flags():
    """'--fused, --epochs, ... and --eval-iters': the flags a resumed run may change, from
    TrainConfig (what --help, the refusal and docs/guide.md list: tests/test_cli.py checks the guide)."""
    flags = [flag_of(name) for name in TrainConfig.resumable_fields()]
    return f"{', '.join(flags[:-1])} and {flags[-1]}"


def _resumed_config(args):
    """The saved run's config with what ``--resume`` may change; flags that would change
    anything else are refused, each named, rather than silently ignored."""
    out = default_out(args)
    if not has_checkpoint(out):
        raise nothing_to_resume(out)
    saved, _ = load_run_checkpoint(find_checkpoint(out, CHECKPOINT_DIR))
    given = explicit_settings(args)
    resumable = TrainConfig.resumable_fields()
    refused = [
        f"{flag_of(name)} {given[name]!r} (the run has {saved.setting(name)!r})"
        for name in given
        if name not in resumable and given[name] != saved.setting(name)
    ]
    if args.preset:  # a preset is many settings at once: refused where one of them differs from the run's
        preset = {**_preset_settings(args.preset), **given}  # a flag beside it overrides it, as in a new run
        differ = [
            f"{flag_of(name)} {value!r}, the run has {saved.setting(name)!r}"
            for name, value in preset.items()
            if name not in resumable and name not in given and value != saved.setting(name)
        ]
        if differ:
            more = "; ..." if len(differ) > 3 else ""
            refused.append(f"--preset {args.preset} (it sets {'; '.join(differ[:3])}{more})")
    if refused:
        raise ConfigError(
            None,
            f"--resume continues {out} with its own settings; refused: {', '.join(refused)}. "
            f"A resumed run may change only {', '.join(flag_of(n) for n in resumable)}; "
            "train with other settings in another --out",
        )
    return saved.replace(out=out, **{k: v for k, v in given.items() if k in resumable})


def _train(args):
    if args.resume and args.overwrite:
        raise _usage("--resume continues the run, --overwrite deletes it: give one of them")
    if args.oversubscribe and args.workers is None:
        raise _usage("--oversubscribe lets --workers N exceed this machine's CPUs: give it with --workers N")
    launching = args.workers is not None and args.workers > 1 and launched_size() == 1
    if launching:  # before anything starts: a typo must not become a thousand processes
        check_local_workers(args.workers, oversubscribe=args.oversubscribe)
    elif args.workers is not None:
        check_workers(args.workers)
    # the settings are checked here too when mpiexec is to start the processes: one error, not N
    if args.resume:
        config = _resumed_config(args)
    else:  # the config's own checks first, then the flags given that this run would ignore
        config = config_from_args(args).validate()
        _refuse_unused_flags(config, explicit_settings(args))
    if launching:
        config.validate()
        return _launch_workers(args.argv, args.workers)
    train(config, resume=args.resume, overwrite=args.overwrite, lang=args.lang)
    return 0


def _launch_workers(argv, workers):
    """``minitensor train --workers N``: the same command line, N times, under this machine's
    mpiexec (the MPICH wheel puts one beside the Python of the virtual environment). Each
    process gets cores / N BLAS and numba threads unless the environment already sets them."""
    import importlib.util
    import shutil
    import subprocess

    if importlib.util.find_spec("mpi4py") is None:
        raise DistributedError(f"--workers {workers} needs MPI, which is not installed: {DIST_EXTRA}")
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    mpiexec = shutil.which("mpiexec", path=search)
    if mpiexec is None:
        raise DistributedError(f"--workers {workers}: no mpiexec found beside Python or on PATH: {DIST_EXTRA}")
    threads = str(max(1, usable_cpus() // workers))
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env.setdefault(name, threads)
    return subprocess.call([mpiexec, "-n", str(workers), sys.executable, "-m", "minitensor", *argv], env=env)


# -- translate / generate ---------------------------------------------------------------------------
def _load_for_inference(directory, device="cpu"):
    """(model in eval mode on ``device``, config, src vocab, tgt vocab, num_steps, tgt_num_steps)
    from a run folder (its best/ weights, else its latest checkpoint/) or a checkpoint folder."""
    try:
        found = find_checkpoint(directory, BEST_DIR)
    except CheckpointError:
        found = find_checkpoint(directory, CHECKPOINT_DIR)
    config, info = load_run_checkpoint(found)
    config = config.replace(device=device)
    src_vocab, tgt_vocab = info["vocabs"]["src"], info["vocabs"]["tgt"]
    model = build_model(config, src_vocab, tgt_vocab)
    load_checkpoint(found, model, restore_rng=False, map_device=device)
    model.eval()
    extra = info["extra"]
    return model, config, src_vocab, tgt_vocab, extra["num_steps"], extra["tgt_num_steps"]


def _load_for_command(args, command):
    """``_load_for_inference`` for ``translate`` / ``generate``, refusing the other kind of model."""
    loaded = _load_for_inference(args.checkpoint, args.device)
    is_lm = loaded[1].model == "lm"
    if is_lm != (command == "generate"):
        kind, other = ("a language model", "generate") if is_lm else ("an encoder-decoder", "translate")
        raise _usage(f"this checkpoint is {kind}; use minitensor {other}")
    return loaded


def _check_input(command, what, text, tokens, vocab, unit, spaces_are_text=False):
    """Refuse empty input (and blank, unless spaces are text: a character LM's prompt may be
    one space); warn about tokens the model never saw (they become <unk>)."""
    if not (text if spaces_are_text else text.strip()):
        raise _usage(f"{what} is empty{' (only spaces)' if text else ''}; give the text to {command}")
    unseen = sorted({t for t in tokens if t not in vocab})
    if unseen:
        shown = ", ".join(map(repr, unseen[:10])) + (", ..." if len(unseen) > 10 else "")
        if "<unk>" not in vocab:  # a vocabulary of the text's characters alone (--no-special-tokens)
            raise _usage(
                f"{what} has {unit} the model never saw in training: {shown}; its vocabulary has no <unk> "
                f"to read them as (trained with --no-special-tokens): leave them out"
            )
        print(
            f"minitensor {command}: warning: {what} has {unit} the model never saw in training: {shown} "
            "(each is read as <unk>)",
            file=sys.stderr,
        )


def _export(args):
    # the onnx package loads only for this command
    from .onnx.lm import export_language_model
    from .onnx.seq2seq import export_encoder_decoder

    model, config, src_vocab, tgt_vocab, num_steps, tgt_num_steps = _load_for_inference(args.checkpoint)
    if config.model == "lm":
        tokenizer = _tokenizer(args, config, tgt_vocab)
        paths = export_language_model(model, args.onnx, tgt_vocab, num_steps, tokens=config.tokens, tokenizer=tokenizer)
    else:  # a Transformer or a GRU with Bahdanau attention
        paths = export_encoder_decoder(
            model, args.onnx, src_vocab, tgt_vocab, num_steps, tgt_num_steps or 2 * num_steps, tokens=config.tokens
        )
    for path in paths:
        print(os.path.abspath(path))
    if config.model == "lm":
        print("model.onnx: tokens (batch, num_steps) -> logits (batch, num_steps, vocab), the full-window forward pass")
    else:
        print(f'translate with: minitensor translate --onnx {args.onnx} "<text>"')
    return 0


def _translate_onnx(args):
    from .onnx.seq2seq import OnnxTranslator  # ONNX Runtime loads only for this command

    if args.beam != 1 or args.show_attention:
        raise _usage("--onnx decodes greedily and keeps no attention weights: leave out --beam and --show-attention")
    try:
        translator = OnnxTranslator(args.onnx)
    except ValueError as e:  # a language model's export: nothing to translate with
        raise _usage(str(e)) from None
    word = translator.tokens == "word"
    for i, line in enumerate(args.text):
        src = tokenize_line(translator.tokens, line)
        _check_input("translate", f"input {i + 1}", line, src, translator.src_vocab, "words" if word else "characters")
        (tokens,) = translator.translate([src], max_len=args.max_len)
        print((" " if word else "").join(tokens))
    return 0


def _translate(args):
    if args.onnx:
        return _translate_onnx(args)
    model, config, src_vocab, tgt_vocab, num_steps, tgt_num_steps = _load_for_command(args, "translate")
    unit = "words" if config.tokens == "word" else "characters"
    sources = [tokenize_text(config, line) for line in args.text]
    for i, (line, src) in enumerate(zip(args.text, sources)):
        _check_input("translate", f"input {i + 1}", line, src, src_vocab, unit)
    for i, src in enumerate(sources):
        # padded as in training (the Bahdanau encoder's GRU reads the padding too)
        steps = max(num_steps, len(src) + 1)
        max_len = args.max_len or tgt_num_steps or 2 * steps
        hyp = translate(
            model, src, src_vocab, tgt_vocab, steps, beam_size=args.beam, max_len=max_len, attention=args.show_attention
        )
        print(detokenize(config, hyp.tokens))
        if args.show_attention:
            path = _attention_png(args, config, model, src, hyp, i)
            print(f"attention: {os.path.abspath(path)}")
    return 0


def _attention_png(args, config, model, src, hyp, i):
    path = os.path.join(args.attention_dir or _run_folder(args.checkpoint), f"translate_attention_{i + 1}.png")
    rows = hyp.tokens + (["<eos>"] if hyp.ended else [])
    cols = src + ["<eos>"]
    attention = hyp.attention[..., : len(cols)]  # the padding columns carry no weight
    if config.model == "bahdanau":
        plot_seq2seq_attention(attention, cols, rows, path=path)
    else:
        plot_cross_attention(attention, cols, rows, path=path)
    return path


EXPLAIN_LM_MAX_LEN = 40  # tokens of a prompt's continuation on the explain page, without --max-len


def _explain(args):
    from .viz import attention_page  # the page's code loads only for this command

    model, config, src_vocab, tgt_vocab, num_steps, tgt_num_steps = _load_for_inference(args.checkpoint, args.device)
    is_lm = config.model == "lm"
    tokens = tokenize_text(config, args.text, _tokenizer(args, config, tgt_vocab))
    unit = "words" if config.tokens == "word" else "characters"
    what = "the prompt" if is_lm else "the input"
    _check_input("explain", what, args.text, tokens, src_vocab, unit, spaces_are_text=is_lm)
    # parsed as `generate` parses them
    cache_options = _options(_split_items(args.cache_opt), "--cache-opt") if args.cache_opt else None
    if cache_options and args.cache is None:
        raise _usage("--cache-opt sets an option of the cache policy: name it with --cache NAME")
    cache = dict(cache=args.cache, cache_options=cache_options)
    if args.cache not in (None, "full") and not is_lm:
        raise _usage(
            f"--cache {args.cache}: the page shows a language model's cache step by step; an encoder-decoder's "
            "page translates with the full cache (leave --cache out)"
        )
    if is_lm:
        if args.beam != 1:
            raise _usage("--beam: a language model's page shows its greedy continuation; leave --beam out")
        label = symbol_text if config.tokens == "bpe" else str
        max_len = args.max_len or EXPLAIN_LM_MAX_LEN
        page = attention_page(model, tokens, tgt_vocab, max_len=max_len, lang=args.lang, token_label=label, **cache)
    else:
        steps = max(num_steps, len(tokens) + 1)
        max_len = args.max_len or tgt_num_steps or 2 * steps
        # padded as in training only where the encoder reads the padding (the Bahdanau GRU); a
        # Transformer's valid_lens hide it, and the page is clearer without it
        padded = num_steps if config.model == "bahdanau" else None
        options = dict(max_len=max_len, beam_size=args.beam, num_steps=padded, lang=args.lang, **cache)
        page = attention_page(model, tokens, src_vocab, tgt_vocab, **options)
    out = args.out or os.path.join(_run_folder(args.checkpoint), "explain.html")
    page.save(out)
    print(f"{detokenize(config, page.output)}")
    size = os.path.getsize(out) / 1024
    print(f"page: {os.path.abspath(out)} ({size:.0f} KiB; open it in a browser, no network needed)")
    return 0


def _run_folder(checkpoint):
    """The run folder of ``checkpoint`` (a run folder, or its best/ or checkpoint/ inside)."""
    run_dir = os.path.abspath(checkpoint.rstrip("/\\"))
    if os.path.basename(run_dir) in (CHECKPOINT_DIR, BEST_DIR):
        run_dir = os.path.dirname(run_dir)
    return run_dir


def _tokenizer(args, config, vocab):
    """A BPE run's tokenizer, from the run folder of ``args.checkpoint``; None for a character LM."""
    return load_tokenizer(_run_folder(args.checkpoint), config, vocab) if config.tokens == "bpe" else None


def _generate(args):
    model, config, _, vocab, _, _ = _load_for_command(args, "generate")
    prompt = tokenize_text(config, args.prompt, _tokenizer(args, config, vocab))
    _check_input("generate", "the prompt (--prompt)", args.prompt, prompt, vocab, "characters", spaces_are_text=True)
    mt.manual_seed(args.seed)
    chain = _generate_decoder(args, vocab)
    cache_options = _options(_split_items(args.cache_opt), "--cache-opt") if args.cache_opt else None
    if cache_options and args.cache is None:
        raise _usage("--cache-opt sets an option of the cache policy: name it with --cache NAME")
    # Past the trained context a model reads positions it never saw: generate restarts in pieces
    # of the context. A cache policy (sinks, window) is the other answer, for positions that are
    # relative (rotary, ALiBi): the text then streams through it in one piece. Absolute ("inputs")
    # positions end at the context whatever the cache, so such a model stays in pieces.
    names = [p for p in (config.positional, config.input_positional) if p and p != "none"]
    absolute = [p for p in names if mt.nn.attention.positional_kind(p) == "inputs"]
    stream = args.cache is not None and not absolute
    hyp = generate(
        model,
        prompt,
        vocab,
        args.max_len,
        window=None if stream else config.lm_num_steps,
        decoder=chain,
        cache=args.cache,
        cache_options=cache_options,
    )
    print(detokenize(config, hyp.tokens))
    stats = getattr(chain.search, "stats", None)
    if stats is not None and stats.proposed:  # speculative decoding: how much of the draft's work was kept
        print(
            f"minitensor generate: speculative decoding accepted {stats.accepted} of {stats.proposed} draft tokens "
            f"({stats.acceptance_rate:.1%}) in {stats.rounds} target calls",
            file=sys.stderr,
        )
    return 0


def _split_items(items):
    """``["sinks=4,window=256", "p=0.9"]`` -> ``["sinks=4", "window=256", "p=0.9"]``: options
    repeated or separated by commas (a comma starts a new option only before ``key=``)."""
    return [part for item in items for part in re.split(r",(?=\s*[\w.]+\s*=)", item)]


def _generate_decoder(args, vocab):
    """The decoder of ``minitensor generate``: ``--decoder NAMES`` with its ``--decoder-opt``s, or
    the one ``--temperature`` / ``--greedy`` / ``--beam`` stand for (sampling at
    ``SAMPLE_TEMPERATURE`` without any); ``--draft RUN`` makes its search ``speculative``."""
    from .inference import decoder

    options = _options(_split_items(args.decoder_opt), "--decoder-opt") if args.decoder_opt else {}
    if options and args.decoder is None:
        raise _usage("--decoder-opt sets an option of a decoder: name it with --decoder NAMES")
    if args.decoder is not None:
        names = [n.strip() for n in args.decoder.split(",")]
    elif args.beam is not None:
        names, options = ["beam"], {"beam_size": args.beam}
    elif args.greedy:
        names = ["greedy"]
    else:
        names, options = ["temperature", "sample"], {"temperature": args.temperature or SAMPLE_TEMPERATURE}
    if args.draft is not None:
        names, options = _with_draft(args, vocab, names, options)
    return decoder(names, **options)


def _with_draft(args, vocab, names, options):
    """``--draft RUN``: the draft model, loaded as ``--checkpoint`` is, becomes the ``draft`` option
    of a ``speculative`` search -- the one named, or the one that replaces ``greedy`` / ``sample``
    (sampling speculative decoding for ``sample``)."""
    from . import plugins

    draft, draft_config, _, draft_vocab, _, _ = _load_for_inference(args.draft, args.device)
    if draft_config.model != "lm":
        raise _usage(f"--draft {args.draft}: this checkpoint is an encoder-decoder; the draft must be a language model")
    if draft_vocab.idx_to_token != vocab.idx_to_token:
        ours, theirs = vocab.idx_to_token, draft_vocab.idx_to_token
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        at = (
            f"; first difference at id {first}: {ours[first]!r} vs {theirs[first]!r}"
            if first < min(len(ours), len(theirs))
            else ""
        )
        sizes = f"both {len(ours)} tokens" if len(ours) == len(theirs) else f"{len(theirs)} tokens vs {len(ours)}"
        raise _usage(
            f"--draft {args.draft}: its vocabulary differs from the checkpoint's ({sizes}{at}); a draft "
            "proposes token ids of the target's vocabulary: train it on the same text "
            "with the same tokenizer"
        )
    kinds = {n: getattr(plugins.lookup("decoder", n), "kind", None) for n in names}
    searches = [n for n in names if kinds[n] == "search"]
    if searches and searches[0] not in ("speculative", "greedy", "sample"):
        raise _usage(f"--draft decodes speculatively: it replaces greedy or sample, not {searches[0]}")
    sample = bool(searches == ["sample"] or (not searches and any(k == "processor" for k in kinds.values())))
    names = [n for n in names if n not in ("greedy", "sample")]
    if "speculative" not in names:
        names.append("speculative")
        options = {**options, "sample": sample}
    return names, {**options, "draft": draft}


# -- the parser -------------------------------------------------------------------------------------
def _common_options():
    """Options every subcommand takes."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="PATH_OR_MODULE",
        help="load a plugin (.py file or module name) for this command (repeatable); "
        "MINITENSOR_PLUGINS=a,b does the same for every command",
    )
    common.add_argument(
        "--debug", action="store_true", default=None, help="show the traceback of an error (also MINITENSOR_DEBUG=1)"
    )
    return common


# Settings whose default is not one value to print: derived from others or from the run.
_DERIVED_DEFAULTS = {"out", "model", "task"}


def _help_recipe(argv):
    """What ``minitensor train ... --help`` shows the defaults of: (the recipe's settings, how the
    command line chose it) for ``--preset NAME`` or ``--text``, else None (the field defaults)."""
    argv = list(argv or ())
    for i, arg in enumerate(argv):
        name = arg.removeprefix("--preset=") if arg.startswith("--preset=") else None
        if arg == "--preset" and i + 1 < len(argv):
            name = argv[i + 1]
        if name in PRESETS:
            return PRESETS[name], f"--preset {name}"
    if "--text" in argv or any(a.startswith("--text=") for a in argv):
        return LM_RECIPE, "--text"
    return None


def _show_defaults(parser, recipe=None):
    """End each flag's help with its default as ``TrainConfig`` holds it (the one place defaults
    live: config.py), and the character LM's where its recipe (``LM_RECIPE``) differs, so that
    ``--help`` never restates a number that could change without it. With ``recipe`` (see
    ``_help_recipe``: ``--help`` after ``--preset NAME`` or ``--text FILE``), the defaults shown
    are those that apply to that command, the recipe's marked as such."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    settings, chosen_by = recipe or ({}, None)
    for action in parser._actions:
        name = action.dest
        default = defaults.get(name, dataclasses.MISSING)
        if name in _DERIVED_DEFAULTS or default is dataclasses.MISSING:
            continue
        from_recipe = name in settings and settings[name] != default
        default = settings.get(name, default)
        mark = f" ({chosen_by})" if from_recipe else ""
        if isinstance(default, bool):  # --norm-first / --no-norm-first: which one holds without either
            if isinstance(action, argparse.BooleanOptionalAction):
                action.help = f"{action.help}; default {action.option_strings[0 if default else 1]}{mark}"
            continue
        if isinstance(default, list):  # --betas 0.9,0.99
            default = ",".join(map(str, default))
        parts = [] if default is None else [f"default {default}{mark}"]
        if recipe is None and name in LM_RECIPE and LM_RECIPE[name] != default:
            parts.append(f"{LM_RECIPE[name]} for --text (the character LM)")
        if parts:
            action.help = "; ".join(([action.help] if action.help else []) + parts)


def _preset_summary(name):
    """'4 blocks of 128, context 64, 2000 steps': a preset's size, read from PRESETS."""
    p = PRESETS[name]
    return f"{p['num_blks']} blocks of {p['num_hiddens']}, context {p['lm_num_steps']}, {p['steps']} steps"


def _add_train_parser(sub, common, help_recipe=None):
    p = sub.add_parser(
        "train",
        parents=[common],
        help="train a Transformer (or Bahdanau model, or char LM) with progress, evaluation, checkpoints and figures",
        description=f"Train on a generated task (default: {TrainConfig.task}), a tab-separated "
        "corpus (--data) or a text (--text, character LM). Defaults: D2L's small "
        f"Transformer, {TransformerConfig.scorer} attention, {TrainConfig.pooling} pooling, "
        f"{TrainConfig.positional} positions, device {TrainConfig.device}.",
    )
    data = p.add_argument_group("data")
    data.add_argument("--task", choices=TASKS, default=None, help="generated task")
    data.add_argument("--data", type=_path, metavar="FILE", help="tab-separated parallel corpus (D2L fra-eng format)")
    data.add_argument("--text", type=_path, metavar="FILE", help="a text file: train a character language model")
    data.add_argument("--num-train", type=int, help="generated training examples")
    data.add_argument("--num-heldout", type=int, help="generated held-out examples")
    data.add_argument("--heldout-fraction", type=float, help="held-out part of a corpus or a text")
    data.add_argument("--min-len", type=int, help="shortest sequence of reverse/copy/sort")
    data.add_argument("--max-len", type=int, help="longest sequence of reverse/copy/sort")
    data.add_argument("--heldout-min-len", type=int, help="shortest held-out sequence (default: --min-len)")
    data.add_argument(
        "--heldout-max-len",
        type=int,
        help="longest held-out sequence (default: --max-len); longer than in training tests length extrapolation",
    )
    data.add_argument("--max-examples", type=int, help="read only this many corpus lines / text characters")
    data.add_argument("--lm-num-steps", type=int, help="window length of the language model")
    data.add_argument(
        "--lm-sampling",
        choices=("partition", "random"),
        help="a language model's training windows: the text cut into windows at fixed places and shuffled "
        "(partition, D2L's) or windows starting anywhere (random, nanoGPT's)",
    )
    data.add_argument(
        "--special-tokens",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a text LM's vocabulary holds <pad>, <bos>, <eos> and <unk> beside the characters",
    )
    data.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        help="a recipe by name, which flags given beside it override: gpt-char is nanoGPT's shakespeare_char "
        f"on a CPU ({_preset_summary('gpt-char')}), gpt-char-gpu its GPU recipe ({_preset_summary('gpt-char-gpu')}); "
        "without --text they train on the Tiny Shakespeare shipped with minitensor",
    )
    data.add_argument(
        "--tokenizer",
        choices=TOKENIZERS,
        help="a text's tokens: char (default) or a byte-level BPE trained on the training text, kept in the run "
        "folder as tokenizer.json",
    )
    data.add_argument(
        "--vocab-size", type=int, help=f"tokens of --tokenizer bpe: 256 bytes + merges; {BPE_VOCAB_SIZE} if not given"
    )
    model = p.add_argument_group("model")
    model.add_argument("--model", choices=MODELS, help=f"default: {TrainConfig.model} (lm with --text)")
    model.add_argument(
        "--scorer",
        help=f"attention scorer plugin (default: {TransformerConfig.scorer}; {Seq2SeqConfig.scorer} for bahdanau)",
    )
    model.add_argument("--pooling", help="attention pooling plugin")
    model.add_argument(
        "--positional",
        help="positional encoding plugin: added to the inputs (sinusoidal), "
        "on queries and keys (rotary) or a bias on the scores (alibi)",
    )
    model.add_argument(
        "--input-positional",
        metavar="NAME",
        help="an inputs encoding beside a qk or scores --positional "
        f"(default: {TrainConfig.input_positional or 'none'})",
    )
    model.add_argument(
        "--positional-opt",
        action="append",
        metavar="KEY=VALUE",
        help="positional encoding option (repeatable), e.g. window=4",
    )
    model.add_argument("--scorer-opt", action="append", metavar="KEY=VALUE", help="scorer option (repeatable)")
    model.add_argument("--pooling-opt", action="append", metavar="KEY=VALUE", help="pooling option (repeatable)")
    model.add_argument("--num-hiddens", type=int)
    model.add_argument("--ffn-num-hiddens", type=int)
    model.add_argument("--num-heads", type=int)
    model.add_argument(
        "--num-kv-heads",
        type=int,
        metavar="G",
        help="grouped-query attention: G key/value heads shared by the query heads (default: "
        "--num-heads; 1 is multi-query)",
    )
    model.add_argument(
        "--fused",
        choices=FUSED,
        help="streamed (FlashAttention) attention: auto streams long sequences where exact; on/off force it "
        "(a resumed run may change it)",
    )
    model.add_argument("--num-blks", type=int)
    model.add_argument("--dropout", type=float)
    model.add_argument(
        "--norm-first",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pre-LN blocks (stable at a high learning rate); --no-norm-first "
        "gives the book's post-LN form (then --dropout 0.1 --lr 3e-3 is the book's recipe)",
    )
    model.add_argument("--activation", choices=ACTIVATIONS, help="the FFN's nonlinearity (gelu: GPT's)")
    model.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="biases in the FFN, the LayerNorms and the output layer",
    )
    model.add_argument(
        "--tie-embeddings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the output layer reuses the token embedding's weight (GPT-2)",
    )
    model.add_argument(
        "--init",
        choices=INITS,
        help="weight initialisation: d2l (each layer's default) or gpt2 (N(0, 0.02^2), residual projections "
        "scaled by 1/sqrt(2 num_blks), embeddings unscaled)",
    )
    opt = p.add_argument_group("optimisation")
    length = opt.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int)
    length.add_argument("--steps", type=int, help="train this many steps instead of whole epochs")
    opt.add_argument("--batch-size", type=int)
    opt.add_argument("--lr", type=float, help="peak learning rate")
    opt.add_argument("--optimizer", choices=OPTIMIZERS)
    opt.add_argument("--weight-decay", type=float)
    opt.add_argument(
        "--decay-all",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="AdamW decays every parameter (the behaviour before 2-axis-only decay: matrices and embeddings, "
        "not biases and LayerNorm gains)",
    )
    opt.add_argument(
        "--betas",
        type=_betas,
        metavar="B1,B2",
        help="Adam's beta1 and beta2 (without it: the optimiser's own, 0.9 and 0.999)",
    )
    opt.add_argument("--min-lr", type=float, help="where the cosine schedule ends")
    opt.add_argument("--schedule", choices=SCHEDULES, help="cosine and noam warm up first")
    opt.add_argument("--warmup-steps", type=int, help=f"default: {WARMUP_FRACTION * 100:g}%% of the steps")
    opt.add_argument("--label-smoothing", type=float)
    opt.add_argument("--clip-grad-norm", type=float, help="0 turns clipping off")
    run = p.add_argument_group("run")
    run.add_argument("--device", help="cpu or cuda (needs the gpu extra and an NVIDIA GPU)")
    run.add_argument("--seed", type=int)
    run.add_argument(
        "--matmul-precision",
        choices=PRECISIONS,
        help="float32 matrix products on a GPU: high lets them use TF32 tensor cores (faster, ~1e-3 relative "
        "error), medium bfloat16 ones (faster still, 8x TF32's error); highest (the default) keeps float32; "
        "the CPU ignores it",
    )
    run.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mixed precision in bfloat16 (mt.autocast, as PyTorch's): matrix products in bfloat16 (a GPU's "
        "bfloat16 tensor cores), softmaxes, norms, sums and the loss in float32, the weights float32; on the "
        "CPU, slower than float32 (no bfloat16 BLAS)",
    )
    run.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="capture each step's forward and backward once as a CUDA graph and replay it by one launch "
        "(the same numbers, without the host's time per kernel launch; needs --device cuda)",
    )
    run.add_argument(
        "--eval-interval",
        type=int,
        metavar="N",
        help="every N steps, log the mean loss of --eval-iters random minibatches of the training and held-out "
        "sets (step N: train loss X, val loss Y)",
    )
    run.add_argument("--eval-iters", type=int, metavar="K", help="minibatches per --eval-interval estimate")
    run.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="train on N processes of this machine (data parallelism over MPI: starts mpiexec; needs the "
        "dist extra), at most one per CPU this process may use; `mpiexec -n N minitensor train ...` does the "
        "same on several hosts",
    )
    run.add_argument(
        "--oversubscribe",
        action="store_true",
        help=f"let --workers exceed the CPUs this process may use, up to {OVERSUBSCRIBE_FACTOR} processes per CPU "
        "(they then take turns on the cores: slower, not faster)",
    )
    run.add_argument(
        "--out",
        type=_path,
        metavar="DIR",
        help="the run folder: checkpoints and figures (default runs/<task>, "
        "runs/lm for --text, runs/corpus for --data)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the run in --out from its checkpoint (only {_resumable_flags()} may change)",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run already in --out (its checkpoints and figures) and start afresh",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar (also off when not a terminal)")
    run.add_argument(
        "--lang",
        choices=("en", "zh"),
        default="en",
        help="the language of the figures' labels: the loss curve and the attention maps (default %(default)s; "
        "zh needs a font with Chinese glyphs)",
    )
    p.set_defaults(func=_train)
    _show_defaults(p, help_recipe)

    where = "a run folder (its best/ weights, else its latest checkpoint/) or a checkpoint folder"
    t = sub.add_parser("translate", parents=[common], help="translate text with a trained encoder-decoder checkpoint")
    t.add_argument("text", nargs="+", help='source text(s), e.g. "3 May 2021"')
    model_from = t.add_mutually_exclusive_group(required=True)
    model_from.add_argument("--checkpoint", type=_path, metavar="DIR", help=where)
    model_from.add_argument(
        "--onnx",
        type=_path,
        metavar="DIR",
        help="an exported encoder-decoder (minitensor export of a Transformer or Bahdanau checkpoint): greedy "
        "decoding with ONNX Runtime, no minitensor model code",
    )
    t.add_argument(
        "--beam",
        type=_beam_width,
        default=1,
        metavar="K",
        help=f"beam search with K beams, at most {MAX_BEAM_SIZE} (default %(default)s: greedy)",
    )
    t.add_argument("--max-len", type=_new_tokens, help="longest output in tokens")
    t.add_argument("--show-attention", action="store_true", help="write the attention heatmap as a PNG")
    t.add_argument(
        "--attention-dir", type=_path, metavar="DIR", help="where the heatmap goes (default: the run directory)"
    )
    t.add_argument(
        "--device", default="cpu", help="where the model runs (default %(default)s; a checkpoint loads on any device)"
    )
    t.set_defaults(func=_translate)

    x = sub.add_parser(
        "export",
        parents=[common],
        help="write a trained model as ONNX graphs (needs the onnx extra)",
        description="Write a trained model as ONNX graphs that ONNX Runtime runs without minitensor. "
        "An encoder-decoder (Transformer or Bahdanau): encoder.onnx, decoder_step.onnx (one decoding step, "
        "the decoder's state in and out) and vocab.json, for minitensor translate --onnx DIR. "
        "A language model: model.onnx, its full-window forward pass (tokens (batch, num_steps) -> logits "
        "(batch, num_steps, vocab), no key/value cache), and vocab.json.",
    )
    x.add_argument("--checkpoint", required=True, type=_path, metavar="DIR", help=where)
    x.add_argument(
        "--onnx",
        required=True,
        type=_path,
        metavar="DIR",
        help="the folder for the graphs and vocab.json (encoder.onnx + decoder_step.onnx, or a language "
        "model's model.onnx)",
    )
    x.set_defaults(func=_export)

    g = sub.add_parser("generate", parents=[common], help="continue a prompt with a trained language-model checkpoint")
    g.add_argument("--checkpoint", required=True, type=_path, metavar="DIR", help=where)
    g.add_argument("--prompt", required=True, help="the text to continue")
    g.add_argument("--max-len", type=_new_tokens, default=100, help="tokens to generate (default %(default)s)")
    search = g.add_mutually_exclusive_group()
    search.add_argument(
        "--temperature",
        type=_positive_number,
        help=f"sample at this temperature (default {SAMPLE_TEMPERATURE}: lower is safer, higher more inventive)",
    )
    search.add_argument(
        "--greedy", action="store_true", help="greedy search instead of sampling (it tends to repeat a phrase)"
    )
    search.add_argument(
        "--beam",
        type=_beam_width,
        metavar="K",
        help=f"beam search with K beams (at most {MAX_BEAM_SIZE}) instead of sampling",
    )
    search.add_argument(
        "--decoder",
        metavar="NAMES",
        help="the decoder: processors and a search by name, comma-separated, e.g. top_p or "
        "temperature,top_k,sample (minitensor plugins lists them; no search: sample after a processor)",
    )
    g.add_argument(
        "--decoder-opt",
        action="append",
        metavar="KEY=VALUE",
        help="a decoder option, e.g. p=0.9, or top_p.p=0.9 when two pieces take it (repeatable, or "
        "several separated by commas: k=50,p=0.9)",
    )
    g.add_argument(
        "--draft",
        type=_path,
        metavar="RUN",
        help="speculative decoding with this smaller language model (a run or checkpoint folder, trained on "
        "the same text) proposing tokens the checkpoint verifies",
    )
    g.add_argument(
        "--cache",
        metavar="NAME",
        help="the key/value cache policy (default: full); a model with relative positions (rotary, ALiBi) then "
        "reads the text in one piece through it, past its trained context, where without a policy it restarts in "
        "pieces of it",
    )
    g.add_argument(
        "--cache-opt",
        action="append",
        metavar="KEY=VALUE",
        help="a cache policy option, e.g. window=256 (repeatable, or several separated by commas: sinks=4,window=256)",
    )
    g.add_argument("--seed", type=_at_least(0), default=0, help="the seed of the sampling (default %(default)s)")
    g.add_argument("--device", default="cpu", help="where the model runs (default %(default)s)")
    g.set_defaults(func=_generate)

    e = sub.add_parser(
        "explain",
        parents=[common],
        help="write one offline HTML page of a model's attention on an input (scores, weights, graph)",
    )
    e.add_argument("text", help='the input: a sentence to translate, or a language model\'s prompt, e.g. "3 May 2021"')
    e.add_argument("--checkpoint", required=True, type=_path, metavar="DIR", help=where)
    e.add_argument("--out", type=_path, metavar="FILE", help="the page (default: explain.html in the run folder)")
    e.add_argument(
        "--lang", choices=("en", "zh"), default="en", help="the language the page opens in (default %(default)s)"
    )
    e.add_argument(
        "--beam",
        type=_beam_width,
        default=1,
        metavar="K",
        help=f"beam search with K beams, at most {MAX_BEAM_SIZE} (default %(default)s: greedy)",
    )
    e.add_argument(
        "--max-len",
        type=_new_tokens,
        help=f"longest output in tokens (a prompt's continuation: {EXPLAIN_LM_MAX_LEN})",
    )
    e.add_argument(
        "--cache",
        metavar="NAME",
        help="a language model's key/value cache policy (default: full); any other adds its contents at each "
        "decoding step to the page",
    )
    e.add_argument(
        "--cache-opt",
        action="append",
        metavar="KEY=VALUE",
        help="a cache policy option, e.g. window=8 (repeatable, or several separated by commas: sinks=4,window=8)",
    )
    e.add_argument("--device", default="cpu", help="where the model runs (default %(default)s)")
    e.set_defaults(func=_explain)


def build_parser(argv=None):
    """The ``minitensor`` argument parser with every subcommand; ``argv``, the command line it is
    for, chooses the defaults ``train --help`` shows (``--preset NAME``'s, ``--text``'s)."""
    common = _common_options()
    # the common options belong to the subcommands only: argparse lets a subcommand's defaults
    # overwrite the same option given before it, so `minitensor --debug train` would lose it
    parser = _Parser(prog="minitensor", description="minitensor: a readable deep-learning framework")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    sub.add_parser("info", parents=[common], help="version and available devices").set_defaults(func=_info)
    plugins_parser = sub.add_parser(
        "plugins",
        parents=[common],
        help="list the scorers, poolings and positional encodings, and where each comes from",
    )
    plugins_parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    plugins_parser.add_argument("-v", "--verbose", action="store_true", help="add a column with each class")
    plugins_parser.set_defaults(func=_plugins)
    demo_parser = sub.add_parser(
        "demo", parents=[common], help="train a small MLP on generated spirals and print its progress"
    )
    demo_parser.add_argument("--epochs", type=_at_least(1), default=30)
    demo_parser.add_argument("--lr", type=_positive_number, default=1e-2)
    demo_parser.add_argument("--seed", type=_at_least(0), default=0)
    demo_parser.add_argument("--device", default="cpu")
    demo_parser.set_defaults(func=_demo)
    _add_train_parser(sub, common, _help_recipe(argv))
    return parser


# -- errors -----------------------------------------------------------------------------------------
class _UsageError(Exception):
    """Bad input found by the command itself (exit code 2)."""


def _usage(message):
    return _UsageError(message)


def _exit_code(error):
    """2 for what the user can fix in the command (input, files, plugins, devices), 1 for a run
    that failed on the way (divergence, a full disk, memory)."""
    if isinstance(error, (TrainingError, MemoryError)):
        return EXIT_FAILED
    if isinstance(error, OSError) and not isinstance(
        error, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
    ):
        return EXIT_FAILED  # e.g. no space left on the device
    return EXIT_USAGE


def _expected(error):
    """The errors minitensor raises on purpose, with messages meant for the user."""
    from . import plugins  # lazily: see the note under the imports

    return isinstance(
        error,
        (
            _UsageError,
            ValueError,
            TypeError,
            KeyError,
            OSError,
            MemoryError,
            CheckpointError,
            TrainingError,
            plugins.PluginError,
            errors.DeviceError,
            DistributedError,
        ),
    )


def _one_line(error):
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    if isinstance(error, OSError) and error.filename and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    return " ".join(str(text).split()) or type(error).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None):
    text = _one_line(message) if isinstance(message, Exception) else " ".join(str(message).split())
    print(f"minitensor: warning: {text.removeprefix('minitensor: ')}", file=sys.stderr)


def _run(args):
    from . import plugins  # lazily: see the note under the imports

    if args.command == "train" and launched_size() > 1:
        # MPI first, in every rank: a rank that fails from here on (a plugin, a checkpoint missing on
        # its host) ends the whole job (_end_job); one that exited before MPI_Init would leave the
        # others waiting in MPI_Init for ever
        import_mpi()
    for spec in getattr(args, "plugin", ()):
        plugins.load_plugin(spec)
    if args.version or args.command is None:
        return _info(args)
    return args.func(args)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    args.argv = argv  # --workers starts mpiexec with this same command line
    prog = f"minitensor {args.command}" if args.command else "minitensor"
    if launched_size() > 1:  # one of the processes of `mpiexec -n N minitensor train`: say which
        prog += f" (rank {launched_rank()} of {launched_size()})"
    debug = getattr(args, "debug", None) or os.environ.get("MINITENSOR_DEBUG", "").strip() not in ("", "0")
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _show_warning
        try:
            code = _run(args)
            sys.stdout.flush()  # now, not at exit: a closed pipe is then caught here
            return code
        except BrokenPipeError:
            # the reader went away (`minitensor plugins | head -3`): end quietly, with the
            # status of a process ended by SIGPIPE, as `seq 1000 | head -3` does, and keep
            # Python's own flush at exit from failing on the closed pipe again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except KeyboardInterrupt as e:
            if debug:
                raise
            print(f"\n{prog}: {e or 'interrupted'}", file=sys.stderr)
            return _end_job(EXIT_INTERRUPTED)
        except Exception as e:
            if debug:
                _end_job(EXIT_FAILED, traceback_of=e)
                raise
            if _expected(e):
                print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
                return _end_job(_exit_code(e))
            print(
                f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (run it again with --debug for the "
                "traceback, and please report it)",
                file=sys.stderr,
            )
            return _end_job(EXIT_FAILED)


def _end_job(code, traceback_of=None):
    """``code``; but in one process of a data-parallel job, the others may be waiting for this one
    in a collective that will never complete: end them all (MPI_Abort), after this one has said why."""
    if launched_size() == 1:
        return code
    started = "mpi4py.MPI" in sys.modules  # else no rank waits for this one
    if started and traceback_of is not None:
        import traceback

        traceback.print_exception(traceback_of)
    # The launcher forwards this rank's output through a pipe and ends the whole job as soon as a
    # rank fails; on a busy machine it could end it before reading why (both streams came back
    # empty, about one job in twenty under load). Give it a moment to read the message.
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(_LAST_WORDS_S)
    if started:
        world().abort(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
