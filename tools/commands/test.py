"""``test [ARGS]``: ``python -m pytest tests`` inside .venv; further arguments go to pytest."""

import sys

from .. import common

PASSTHROUGH = True  # arguments after the command name go to pytest, unparsed


def setup_arguments(subparsers):
    return subparsers.add_parser("test", add_help=False,  # so that `test --help` shows pytest's help
                                 help="run python -m pytest tests; further arguments go to pytest")


def run(args):
    return common.run(sys.executable, "-m", "pytest", "tests", *args.rest, check=False)
