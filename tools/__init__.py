"""The project's commands, run through ``python3 tools/dev.py COMMAND``; see tools/dev.py."""
