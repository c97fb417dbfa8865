"""One module per command, as asv's ``asv/commands/``: ``setup_arguments(subparsers)`` and ``run(args)`` (the exit
code). A command imports only the standard library at module level: tools/dev.py parses before .venv exists."""

from . import bench, browser_check, gate, report, test

COMMANDS = [bench, gate, test, report, browser_check]
