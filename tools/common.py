"""What every command shares: the repository, git, asv's command line and the one error class."""

import subprocess
import sys
from pathlib import Path

from . import processes

ROOT = Path(__file__).resolve().parents[1]  # the repository; tests point it at a repository of their own
BRANCH = "main"
INSIDE_VENV = "KV_ATTENTION_DEV_VENV"  # set to "1" once a command runs inside .venv (tools/dev.py)


class UserError(Exception):
    """A failure the user can fix: printed as one line (``<command>: error: ...``), never as a traceback."""


def run(*command, check=True):
    """Run a command from the repository root; its exit code (UserError if it fails and ``check``).

    The command runs in a session of its own and is stopped, with every process
    it started, when this one is (:mod:`tools.processes`).
    """
    result = processes.run(command, cwd=ROOT)
    if check and result.returncode != 0:
        raise UserError(f"`{' '.join(map(str, command))}` exited {result.returncode}")
    return result.returncode


def git(*args):
    """Stdout of ``git ARGS`` in the repository, stripped; UserError if git fails."""
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def resolve(name):
    """The full hash of commit ``name``; UserError naming it if there is no such commit."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    except UserError:
        raise UserError(f"{name!r} is not a commit of this repository") from None


ASV = (sys.executable, "-m", "asv")  # asv of the Python running the command (.venv's)


def use_machine(name=None):
    """Make ``name`` (default: :func:`tools.machine.default_name`) asv's machine name in this process; return it.

    The asv plugin does the same in every asv process, so both agree on where results live.
    """
    from asv.machine import Machine

    from .machine import default_name

    if name is not None or Machine.hardcoded_machine_name is None:
        Machine.hardcoded_machine_name = name or default_name()
    return Machine.get_unique_machine_name()


def record_machine(name=None):
    """``asv machine --yes --machine NAME``: store this machine (hostname, CPU, RAM) under ``name``, no questions.

    ``name`` defaults to :func:`tools.machine.default_name`, hostname plus hardware fingerprint.
    """
    from asv.machine import Machine

    name = use_machine(name)
    result = processes.run([*ASV, "machine", "--yes", "--machine", name], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"asv machine --yes failed: {result.stderr.strip() or result.stdout.strip()}")
    info = Machine.get_defaults()
    print(f"machine {name!r}: {info['cpu']}, {info['num_cpu']} CPUs, {info['os']}", flush=True)


def asv_run(commits, *options, progress=None):
    """``asv run`` over ``commits`` (a HASHFILE), skipping benchmarks already stored; asv's exit code.

    ``progress``, if given, is called with every line asv prints, after it is printed.
    """
    hashfile = ROOT / ".asv" / "commits-to-run.txt"
    hashfile.parent.mkdir(exist_ok=True)
    hashfile.write_text("\n".join(commits) + "\n")
    command = (*ASV, "run", f"HASHFILE:{hashfile}", "--skip-existing", "--record-samples",
               "--machine", use_machine(), *options)
    if progress is None:
        return run(*command, check=False)

    def show(line):
        print(line, end="", flush=True)
        progress(line)

    return processes.run(command, cwd=ROOT, lines=show).returncode
