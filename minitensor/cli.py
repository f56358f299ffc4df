"""The ``minitensor`` command line."""

import argparse
import sys


def _info(args):
    import minitensor as mt

    print(f"minitensor {mt.__version__}")
    print(f"devices: {', '.join(mt.available_backends())}")
    return 0


def _demo(args):
    from . import demo

    return demo.main(args)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="minitensor", description="minitensor: a readable deep-learning framework")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="version and available devices").set_defaults(func=_info)
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
