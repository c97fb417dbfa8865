"""A working example for every command of ``tools/dev.py``: shown by its ``--help`` and by a usage error.

:data:`EXAMPLES` maps a command (``"report compare"``) to command lines that
work as typed from the repository root: those with ``--results-dir
docs/results`` on a fresh clone (the stored results of the README), the others
once the main job (``bench``) has stored results. tests/tools/test_dev.py parses
every one and runs those of the report on docs/results.
"""

import argparse
import sys

DEV = "python3 tools/dev.py"
STORED = "--results-dir docs/results --machine vm-f980c2bd"  # the README's figures' results, in every clone
RUN = "--commit 4fbab830"  # the stored run the README quotes (named: it is on main only once merged)
EXAMPLES = {
    "": [f"{DEV} bench", f"{DEV} report tables {STORED} {RUN}", f"{DEV} test tests/tools/test_dev.py"],
    "bench": [f"{DEV} bench", f"{DEV} bench --commits 3"],
    "test": [f"{DEV} test", f"{DEV} test tests/tools/test_dev.py::test_bad_command_lines_exit_2_without_a_traceback",
             f"{DEV} test -m asv_commands"],
    "gate": [f"{DEV} gate HEAD~1 HEAD", f"{DEV} gate main HEAD --bench 'CacheStrategy.time_decode'"],
    "bisect": [f"{DEV} bisect HEAD~8 HEAD --bench \"CacheStrategy.time_decode\\(256, 'concat'\\)\""],
    "report": [f"{DEV} report tables {STORED} {RUN}", f"{DEV} report tables"],
    "report tables": [f"{DEV} report tables {STORED} {RUN} --experiment cache", f"{DEV} report tables --commit HEAD~1"],
    "report compare": [f"{DEV} report compare HEAD~1 HEAD",
                       f"{DEV} report compare {STORED} 4fbab830 4fbab830 --experiment batch   # one commit there"],
    "report csv": [f"{DEV} report csv {STORED} --out samples.csv", f"{DEV} report csv --out -"],
    "report plots": [f"{DEV} report plots {STORED} {RUN} --out plots --lab", f"{DEV} report plots --commit HEAD --out plots"],
    "publish": [f"{DEV} publish"],
    "noise": [f"{DEV} noise aa --bench CacheStrategy"],
    "noise aa": [f"{DEV} noise aa --bench CacheStrategy"],
    "noise slowdown": [f"{DEV} noise slowdown concat --slowdown 0.05,0.10"],
    "noise work": [f"{DEV} noise work preallocated --extra 0.01,0.02"],
    "noise broken": [f"{DEV} noise broken concat"],
    "noise history": [f"{DEV} noise history --library-commits 60"],
    "browser-check": [f"{DEV} browser-check"],
}


def text(command):
    """The examples of ``command`` as the lines --help and a usage error end with."""
    lines = EXAMPLES.get(command, [])
    return ("example:" if len(lines) == 1 else "examples:") + "".join(f"\n  {line}" for line in lines)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage error shows the command's examples before the error line."""

    command = ""

    def error(self, message):
        self.print_usage(sys.stderr)
        if EXAMPLES.get(self.command):
            print(text(self.command), file=sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def subcommands(parser, prefix=""):
    """``{command: parser}`` of ``parser`` and every subcommand under it (``"report csv"``)."""
    found = {prefix: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(subcommands(sub, f"{prefix} {name}".strip()))
    return found


def chosen(parser, args):
    """The deepest subcommand parser ``args`` went through (``report tables``'s, for report tables)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return chosen(action.choices[getattr(args, action.dest)], args)
    return parser


def add(parser):
    """Give every (sub)command of ``parser`` its examples: at the end of --help, and in a usage error."""
    for command, sub in subcommands(parser).items():
        sub.command = command
        if EXAMPLES.get(command):
            sub.epilog = text(command) if not sub.epilog else f"{sub.epilog}\n\n{text(command)}"
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser
