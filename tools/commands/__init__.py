"""One module per command, as asv's ``asv/commands/``: each has ``setup_arguments(subparsers)`` and ``run(args)``.

A command module imports only the standard library at module level (asv and
numpy inside functions), so that ``tools/dev.py`` can parse a command line
before ``.venv`` exists. ``run`` returns the exit code; a
:class:`tools.common.UserError` it raises is printed as one line.
"""

from . import bench, bisect, browser_check, gate, noise, publish, report, test

COMMANDS = [bench, gate, bisect, test, report, publish, noise, browser_check]
