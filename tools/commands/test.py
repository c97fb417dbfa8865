"""``test [ARGS]``: ``python -m pytest`` inside .venv; ARGS go to pytest as given.

Without paths or node ids pytest collects setup.cfg's ``testpaths`` (``tests``);
with them (``tests/tools/test_dev.py::test_x``), only what they name. So the
command adds nothing to ARGS: a ``tests`` of its own would make pytest collect
the whole suite beside what ARGS name.
"""

import sys

from .. import common, examples

PASSTHROUGH = True  # arguments after the command name go to pytest, unparsed


def setup_arguments(subparsers):
    return subparsers.add_parser("test", add_help=False,  # so that `test --help` shows pytest's help
                                 help="run python -m pytest (setup.cfg's testpaths: tests); further arguments "
                                      "go to pytest as given")


def run(args):
    if {"-h", "--help"} & set(args.rest):  # pytest's help follows: first, this command's own line
        print(f"usage: tools/dev.py test [ARGS]: python -m pytest ARGS, inside .venv (pytest's help follows)\n"
              f"{examples.text('test')}\n", flush=True)
    return common.run(sys.executable, "-m", "pytest", *args.rest, check=False)
