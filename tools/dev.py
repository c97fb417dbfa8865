#!/usr/bin/env python3
"""The project's commands, for a fresh machine with Python >= 3.10, git and pip.

    python3 tools/dev.py bench [--all | --commits N] [--machine NAME]
                                                  the main job: benchmark a bounded sample of the commits of
                                                  main that can change a result, publish the dashboard
    python3 tools/dev.py test [ARGS]              python -m pytest: tests, or only the paths and node ids
                                                  ARGS name (ARGS go to pytest as given)
    python3 tools/dev.py gate BASE HEAD [--factor F] [--count-factor F] [--bench REGEX]
                                                  benchmark two commits where needed, compare the counts
                                                  (work) and the timings (time), exit 0/1/2
    python3 tools/dev.py bisect GOOD BAD --bench REGEX   the first commit where one point got worse (gate's rule)
    python3 tools/dev.py report {tables,compare,csv,plots} ...   the lab's tables, samples and plots
    python3 tools/dev.py publish                  the dashboard from the stored results
    python3 tools/dev.py noise {aa,slowdown,work,broken,history} ...   drills of the gate and the main job
    python3 tools/dev.py browser-check            the dashboard in headless Chromium, offline

Each command is a module of ``tools/commands/``. This file only parses the
command line, makes ``.venv`` and installs the project with its test, bench
and browser extras there (again only when setup.cfg or pyproject.toml
change), re-runs itself inside it, and calls the command. asv builds its own
per-commit virtualenvs under .asv/env.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

if not __package__:  # run as a file: run as the module tools.dev, from the repository root
    os.chdir(Path(__file__).resolve().parents[1])
    os.execv(sys.executable, [sys.executable, "-m", "tools.dev", *sys.argv[1:]])

from . import common, examples, lock, processes  # noqa: E402
from .commands import COMMANDS  # noqa: E402

VENV = common.ROOT / ".venv"


def venv_python():
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv():
    """Create .venv and install ``.[test,bench,browser]`` into it when missing or out of date."""
    if not venv_python().exists():  # missing, or left by a Python that is gone: (re)make it
        print(f"creating {VENV.relative_to(common.ROOT)} ...", flush=True)
        if subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)]).returncode != 0:
            raise common.UserError(f"python -m venv failed; on Debian/Ubuntu install python3-venv, or delete {VENV}")
    stamp = VENV / "kv-attention-installed"
    files = (common.ROOT / f for f in ("setup.cfg", "pyproject.toml"))
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    print("installing kv_attention[test,bench,browser] into .venv ...", flush=True)
    pip = [str(venv_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if subprocess.run(pip + ["-e", f"{common.ROOT}[test,bench,browser]"]).returncode != 0:
        raise common.UserError("pip install of the project's test/bench dependencies failed (see above)")
    stamp.write_text(digest)


def make_parser():
    """``(parser, {command: module})``: every command's parser, each with its examples (tools/examples.py)."""
    parser = examples.Parser(prog="tools/dev.py", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)  # each a Parser too: argparse's default
    modules = {}
    for module in COMMANDS:
        modules[module.setup_arguments(subparsers).prog.split()[-1]] = module
    return examples.add(parser), modules


def parse_args(argv):
    parser, modules = make_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(modules[args.command], "PASSTHROUGH", False):
        examples.chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    args.module, args.rest = modules[args.command], extra
    return args


def run_command(args):
    """``args.module.run(args)``, holding the workspace lock if the command declares ``LOCKS_WORKSPACE``."""
    if not getattr(args.module, "LOCKS_WORKSPACE", False):
        return args.module.run(args) or 0
    with lock.workspace(f"tools/dev.py {args.command}"):
        return args.module.run(args) or 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if os.environ.get(common.INSIDE_VENV) != "1":
            ensure_venv()
            os.environ[common.INSIDE_VENV] = "1"
            os.execv(str(venv_python()), [str(venv_python()), "-m", "tools.dev", *argv])
        with processes.handle_signals():
            return run_command(args)
    except common.UserError as error:
        print(f"tools/dev.py {args.command}: error: {error}", file=sys.stderr)
        return getattr(args.module, "ERROR_EXIT", 1)  # gate: 1 means a regression, never an error
    except processes.Stopped as stopped:
        print(f"tools/dev.py {args.command}: stopped by {stopped}, with every process it started "
              f"(exit {stopped.exit_code})", file=sys.stderr)
        return stopped.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
