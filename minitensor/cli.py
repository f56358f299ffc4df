"""The ``minitensor`` command line."""

import argparse
import sys


def _info(args):
    import minitensor as mt

    print(f"minitensor {mt.__version__}")
    print(f"devices: {', '.join(mt.available_backends())}")
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


def main(argv=None):
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
    args = parser.parse_args(argv)
    if args.version or args.command is None:
        return _info(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
