"""The ``minitensor`` command line."""

import argparse
import sys


def _info(args):
    import minitensor as mt

    print(f"minitensor {mt.__version__}")
    print(f"devices: {', '.join(mt.available_backends())}")
    reason = mt.cuda.unavailable_reason()
    print("cuda: available" if reason is None else f"cuda: not available ({reason})")
    return 0


def _plugins(args):
    """List every scorer, pooling and positional encoding with the plugin it comes from."""
    import json

    from . import plugins

    try:
        rows = plugins.describe()
    except plugins.PluginError as e:  # e.g. MINITENSOR_STRICT_PLUGINS=1 and a broken plugin
        print(f"minitensor plugins: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = [("name", "NAME"), ("kind", "KIND"), ("source", "SOURCE")]
    if args.verbose:
        columns.append(("class", "CLASS"))
    # every column as wide as its widest cell, so the table lines up
    widths = [max([len(title)] + [len(row[key]) for row in rows]) for key, title in columns]
    for cells in [[title for _, title in columns]] + [[row[key] for key, _ in columns] for row in rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip())
    return 0


def _demo(args):
    from . import demo

    return demo.main(args)


def _options(items, what):
    from .train.config import parse_options

    try:
        return parse_options(items, what)
    except ValueError as e:
        raise SystemExit(f"minitensor: error: {e}")


def config_from_args(args):
    """A TrainConfig from ``minitensor train``'s arguments (flags left out keep the defaults)."""
    from .train.config import TrainConfig

    config = TrainConfig()
    changes = {}
    for name in ("task", "data", "text", "model", "scorer", "pooling", "positional", "num_hiddens", "ffn_num_hiddens",
                 "num_heads", "num_blks", "dropout", "epochs", "steps", "batch_size", "lr", "device", "seed", "out",
                 "label_smoothing", "num_train", "num_heldout", "min_len", "max_len", "max_examples", "optimizer",
                 "weight_decay", "schedule", "warmup_steps", "clip_grad_norm", "lm_num_steps"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    if args.norm_first is not None:
        changes["norm_first"] = args.norm_first
    if args.no_progress:
        changes["progress"] = False
    changes["scorer_options"] = _options(args.scorer_opt, "--scorer-opt")
    changes["pooling_options"] = _options(args.pooling_opt, "--pooling-opt")
    if args.text and "model" not in changes:
        changes["model"] = "lm"
    if args.task in ("reverse", "copy", "sort") and "out" not in changes:
        changes["out"] = f"runs/{args.task}"
    elif "out" not in changes:
        changes["out"] = "runs/lm" if args.text else "runs/corpus" if args.data else "runs/date"
    return config.replace(**changes)


def _train(args):
    import os

    from .train.checkpoint import CheckpointError, load_checkpoint
    from .train.config import TrainConfig
    from .train.loop import CHECKPOINT_DIR, TrainingError, train

    config = config_from_args(args)
    if args.resume:
        # The run continues with its own settings; only the length (and progress bar) may change.
        try:
            saved = load_checkpoint(os.path.join(config.out, CHECKPOINT_DIR), restore_rng=False)["config"]
        except CheckpointError as e:
            print(f"minitensor train: error: {e}", file=sys.stderr)
            return 1
        changes = {k: getattr(config, k) for k in ("epochs", "steps") if getattr(args, k) is not None}
        changes["progress"] = config.progress
        config = TrainConfig.from_dict(saved).replace(**changes)
    from .errors import DeviceError
    from .plugins import PluginError, UnknownPluginError

    try:
        config.validate()
        train(config, resume=args.resume)
    except (TrainingError, CheckpointError, ValueError, OSError, PluginError, UnknownPluginError, TypeError,
            DeviceError) as e:
        # TypeError: an attention plugin rejected its options (--scorer-opt / --pooling-opt)
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"minitensor train: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted; the last checkpoint (end of the last finished epoch) is in "
              f"{os.path.join(config.out, CHECKPOINT_DIR)}: continue with minitensor train --out {config.out} --resume",
              file=sys.stderr)
        return 130
    return 0


def _load_for_inference(directory, device="cpu"):
    """(model in eval mode on ``device``, config, src vocab, tgt vocab, num_steps, tgt_num_steps) from a checkpoint
    directory (a run's --out, or its checkpoint/ folder)."""
    import os

    from .train.checkpoint import load_checkpoint
    from .train.config import TrainConfig, build_model
    from .train.loop import CHECKPOINT_DIR

    if os.path.isdir(os.path.join(directory, CHECKPOINT_DIR)):
        directory = os.path.join(directory, CHECKPOINT_DIR)
    info = load_checkpoint(directory, restore_rng=False)
    if not info["config"]:
        raise ValueError(f"{directory}: the checkpoint holds no training config; cannot rebuild its model")
    config = TrainConfig.from_dict(info["config"]).replace(device=device)
    src_vocab, tgt_vocab = info["vocabs"]["src"], info["vocabs"]["tgt"]
    model = build_model(config, src_vocab, tgt_vocab)
    load_checkpoint(directory, model, restore_rng=False, map_device=device)
    model.eval()
    extra = info["extra"] or {}
    return model, config, src_vocab, tgt_vocab, extra.get("num_steps", 0), extra.get("tgt_num_steps")


def _load_for_command(args, command):
    """``_load_for_inference`` for ``translate`` / ``generate``: None (after one error line) when
    the checkpoint cannot be loaded or holds the other kind of model."""
    from .errors import DeviceError
    from .train.checkpoint import CheckpointError

    try:
        loaded = _load_for_inference(args.checkpoint, args.device)
    except (CheckpointError, ValueError, DeviceError) as e:
        print(f"minitensor {command}: error: {e}", file=sys.stderr)
        return None
    is_lm = loaded[1].model == "lm"
    if is_lm != (command == "generate"):
        kind, other = ("a language model", "generate") if is_lm else ("an encoder-decoder", "translate")
        print(f"minitensor {command}: error: this checkpoint is {kind}; use minitensor {other}", file=sys.stderr)
        return None
    return loaded


def _translate(args):
    import os

    from .train.config import detokenize, tokenize_text
    from .train.decoding import translate

    loaded = _load_for_command(args, "translate")
    if loaded is None:
        return 1
    model, config, src_vocab, tgt_vocab, num_steps, tgt_num_steps = loaded
    for i, line in enumerate(args.text):
        src = tokenize_text(config, line)
        # padded as in training (the Bahdanau encoder's GRU reads the padding too)
        steps = max(num_steps, len(src) + 1)
        max_len = args.max_len or tgt_num_steps or 2 * steps
        hyp = translate(model, src, src_vocab, tgt_vocab, steps, beam_size=args.beam, max_len=max_len,
                        attention=args.show_attention)
        print(detokenize(config, hyp.tokens))
        if args.show_attention:
            path = _attention_png(args, config, model, src, hyp, i)
            print(f"attention: {os.path.abspath(path)}")
    return 0


def _attention_png(args, config, model, src, hyp, i):
    import os

    from .train.plots import plot_cross_attention, plot_seq2seq_attention

    run_dir = os.path.abspath(args.checkpoint.rstrip("/\\"))
    if os.path.basename(run_dir) == "checkpoint":  # given the checkpoint itself: its run directory
        run_dir = os.path.dirname(run_dir)
    path = os.path.join(args.attention_dir or run_dir, f"translate_attention_{i + 1}.png")
    rows = hyp.tokens + (["<eos>"] if hyp.ended else [])
    cols = src + ["<eos>"]
    attention = hyp.attention[..., :len(cols)]  # the padding columns carry no weight
    if config.model == "bahdanau":
        plot_seq2seq_attention(attention, cols, rows, path=path)
    else:
        plot_cross_attention(attention, cols, rows, path=path)
    return path


def _generate(args):
    from .train.config import detokenize, tokenize_text
    from .train.decoding import generate

    loaded = _load_for_command(args, "generate")
    if loaded is None:
        return 1
    model, config, _, vocab, _, _ = loaded
    import minitensor as mt

    mt.manual_seed(args.seed)
    hyp = generate(model, tokenize_text(config, args.prompt), vocab, args.max_len, beam_size=args.beam,
                   temperature=args.temperature)
    print(detokenize(config, hyp.tokens))
    return 0


def _add_train_parser(sub):
    from .train.config import MODELS, OPTIMIZERS, SCHEDULES, TASKS

    p = sub.add_parser("train", help="train a Transformer (or Bahdanau model, or char LM) with progress, "
                                     "evaluation, checkpoints and figures",
                       description="Train on a generated task (default: date normalisation), a tab-separated "
                                   "corpus (--data) or a text (--text, character LM). Defaults: D2L's small "
                                   "Transformer, scaled_dot attention, softmax pooling, sinusoidal positions, CPU.")
    data = p.add_argument_group("data")
    data.add_argument("--task", choices=TASKS, default=None, help="generated task (default: date)")
    data.add_argument("--data", metavar="FILE", help="tab-separated parallel corpus (D2L fra-eng format)")
    data.add_argument("--text", metavar="FILE", help="a text file: train a character language model")
    data.add_argument("--num-train", type=int, help="generated training examples (default 20000)")
    data.add_argument("--num-heldout", type=int, help="generated held-out examples (default 1000)")
    data.add_argument("--min-len", type=int, help="shortest sequence of reverse/copy/sort (default 1)")
    data.add_argument("--max-len", type=int, help="longest sequence of reverse/copy/sort (default 10)")
    data.add_argument("--max-examples", type=int, help="read only this many corpus lines / text characters")
    data.add_argument("--lm-num-steps", type=int, help="window length of the language model (default 64)")
    model = p.add_argument_group("model")
    model.add_argument("--model", choices=MODELS, help="default: transformer (lm with --text)")
    model.add_argument("--scorer", help="attention scorer plugin (default scaled_dot; additive for bahdanau)")
    model.add_argument("--pooling", help="attention pooling plugin (default softmax)")
    model.add_argument("--positional", help="positional encoding plugin (default sinusoidal)")
    model.add_argument("--scorer-opt", action="append", metavar="KEY=VALUE", help="scorer option (repeatable)")
    model.add_argument("--pooling-opt", action="append", metavar="KEY=VALUE", help="pooling option (repeatable)")
    model.add_argument("--num-hiddens", type=int)
    model.add_argument("--ffn-num-hiddens", type=int)
    model.add_argument("--num-heads", type=int)
    model.add_argument("--num-blks", type=int)
    model.add_argument("--dropout", type=float)
    model.add_argument("--norm-first", action=argparse.BooleanOptionalAction, default=None,
                       help="pre-LN blocks (the default, stable at a high learning rate); --no-norm-first "
                            "gives the book's post-LN form (then --dropout 0.1 --lr 3e-3 is the book's recipe)")
    opt = p.add_argument_group("optimisation")
    length = opt.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, help="default 4")
    length.add_argument("--steps", type=int, help="train this many steps instead of whole epochs")
    opt.add_argument("--batch-size", type=int)
    opt.add_argument("--lr", type=float, help="peak learning rate (default 1e-2)")
    opt.add_argument("--optimizer", choices=OPTIMIZERS)
    opt.add_argument("--weight-decay", type=float)
    opt.add_argument("--schedule", choices=SCHEDULES, help="default: cosine (with warm-up)")
    opt.add_argument("--warmup-steps", type=int, help="default: 5%% of the steps")
    opt.add_argument("--label-smoothing", type=float)
    opt.add_argument("--clip-grad-norm", type=float, help="default 1.0; 0 turns clipping off")
    run = p.add_argument_group("run")
    run.add_argument("--device", help="cpu (default) or cuda (needs the gpu extra and an NVIDIA GPU)")
    run.add_argument("--seed", type=int)
    run.add_argument("--out", metavar="DIR", help="where the checkpoint and figures go (default runs/<task>)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    run.add_argument("--no-progress", action="store_true", help="no progress bar (also off when not a terminal)")
    p.set_defaults(func=_train)

    t = sub.add_parser("translate", help="translate text with a trained encoder-decoder checkpoint")
    t.add_argument("text", nargs="+", help="source text(s), e.g. \"3 May 2021\"")
    t.add_argument("--checkpoint", required=True, metavar="DIR", help="a run's --out directory or its checkpoint/")
    t.add_argument("--beam", type=int, default=1, metavar="K", help="beam search with K beams (default 1: greedy)")
    t.add_argument("--max-len", type=int, help="longest output in tokens")
    t.add_argument("--show-attention", action="store_true", help="write the attention heatmap as a PNG")
    t.add_argument("--attention-dir", metavar="DIR", help="where the heatmap goes (default: the run directory)")
    t.add_argument("--device", default="cpu", help="where the model runs (default cpu; a checkpoint loads on any device)")
    t.set_defaults(func=_translate)

    g = sub.add_parser("generate", help="continue a prompt with a trained language-model checkpoint")
    g.add_argument("--checkpoint", required=True, metavar="DIR")
    g.add_argument("--prompt", default="", help="the text to continue")
    g.add_argument("--max-len", type=int, default=100, help="tokens to generate (default 100)")
    g.add_argument("--beam", type=int, default=1, metavar="K")
    g.add_argument("--temperature", type=float, help="sample at this temperature instead of greedy search")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="cpu", help="where the model runs (default cpu)")
    g.set_defaults(func=_generate)


def build_parser():
    """The ``minitensor`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="minitensor", description="minitensor: a readable deep-learning framework")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="version and available devices").set_defaults(func=_info)
    plugins = sub.add_parser("plugins", help="list the scorers, poolings and positional encodings, and where each comes from")
    plugins.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    plugins.add_argument("-v", "--verbose", action="store_true", help="add a column with each class")
    plugins.set_defaults(func=_plugins)
    demo = sub.add_parser("demo", help="train a small MLP on generated spirals and print its progress")
    demo.add_argument("--epochs", type=int, default=30)
    demo.add_argument("--lr", type=float, default=1e-2)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--device", default="cpu")
    demo.set_defaults(func=_demo)
    _add_train_parser(sub)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.version or args.command is None:
        return _info(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
