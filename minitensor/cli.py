"""The ``minitensor`` command line."""

import argparse
import sys


def _info(args):
    import minitensor as mt

    print(f"minitensor {mt.__version__}")
    print(f"devices: {', '.join(mt.available_backends())}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="minitensor", description="minitensor: a readable deep-learning framework")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="version and available devices").set_defaults(func=_info)
    args = parser.parse_args(argv)
    if args.version or args.command is None:
        return _info(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
