"""One module per command, as asv's ``asv/commands/``: each has ``setup_arguments(subparsers)`` and ``run(args)``.

A command module imports only the standard library at module level, so that ``tools/dev.py`` can parse a
command line before ``.venv`` exists; ``run`` returns the exit code.
"""

from . import bench, bisect, browser_check, gate, publish, report, test

COMMANDS = [bench, gate, bisect, test, report, publish, browser_check]
