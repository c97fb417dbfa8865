"""``test [ARGS]``: ``python -m pytest ARGS`` inside .venv (setup.cfg's testpaths without ARGS)."""

import subprocess
import sys

from .. import common

PASSTHROUGH = True  # arguments after the command name go to pytest, unparsed


def setup_arguments(subparsers):
    return subparsers.add_parser("test", add_help=False, help="python -m pytest ARGS, inside .venv")


def run(args):
    return subprocess.run([sys.executable, "-m", "pytest", *args.rest], cwd=common.ROOT).returncode
