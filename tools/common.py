"""What every command shares: the repository, git, asv's command line, the workspace lock, stopping children."""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository; tests point it at a repository of their own
BRANCH = "main"
INSIDE_VENV = "KV_ATTENTION_DEV_VENV"  # "1" once a command runs inside .venv (tools/dev.py)
ASV = (sys.executable, "-m", "asv")  # asv of the Python running the command (.venv's)
GRACE = 10.0  # seconds the processes of a stopped child get before SIGKILL


class UserError(Exception):
    """A failure the user can fix: printed as one line, never as a traceback."""


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the command."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def checked(convert, test, what):
    """An argparse type: ``convert(text)``, refused in one usage line unless ``test`` holds for it."""
    def parse(text):
        with contextlib.suppress(ValueError):
            if test(value := convert(text)):
                return value
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return parse


def session(sid):
    """``{pid: process group}`` of the live processes of session ``sid`` (asv gives each benchmark a group)."""
    members = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()  # state ppid pgrp session
            if int(fields[3]) == sid and fields[0] != "Z":
                members[int(name)] = int(fields[2])
    return members


def stop(proc, signum):
    """``signum`` to every process group of ``proc``'s session; SIGKILL after GRACE seconds."""
    deadline, sig = time.monotonic() + GRACE, signum
    while True:
        for group in {proc.pid, *session(proc.pid).values()}:
            with contextlib.suppress(OSError):
                os.killpg(group, sig)
        proc.poll()
        if not session(proc.pid) or sig == signal.SIGKILL:
            break
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.05)
    proc.wait()


def run(*command, check=True, capture=False):
    """Run ``command`` from ROOT in a new session: its exit code, or its CompletedProcess with ``capture``. A
    :class:`Stopped` stops the session with SIGTERM (SIGINT would print asv's chained tracebacks)."""
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen([str(c) for c in command], cwd=ROOT, start_new_session=True, text=True, stdout=pipe,
                            stderr=pipe)
    try:
        out, err = proc.communicate()
    except BaseException:
        stop(proc, signal.SIGTERM)
        raise
    if check and proc.returncode != 0:
        raise UserError(f"`{' '.join(map(str, command))}` exited {proc.returncode}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err) if capture else proc.returncode


def git(*args):
    """Stdout of ``git ARGS`` in ROOT, stripped; UserError if git fails."""
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def resolve(name):
    """The full hash of commit ``name``."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    except UserError:
        raise UserError(f"{name!r} is not a commit of this repository") from None


def machine_name():
    """``<hostname>-<8 hex digits>``: a hash of the CPU model, core count, architecture and /etc/machine-id."""
    def read(path):
        return Path(path).read_text() if Path(path).is_file() else ""

    cpu = re.search(r"^model name\s*:(.*)$", read("/proc/cpuinfo"), re.M)
    text = "\n".join([cpu.group(1).strip() if cpu else platform.processor(), str(os.cpu_count()), platform.machine(),
                      read("/etc/machine-id").strip()])
    return f"{platform.node() or 'host'}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def record_machine():
    """Record this machine in ``~/.asv-machine.json`` as :func:`machine_name`, returned. ``asv machine --yes`` records
    what asv detects under the hostname, then ``--machine NAME`` copies it (alone, asv 0.6.6 stores the name only)."""
    name = machine_name()
    for extra in ([], ["--machine", name]):
        result = run(*ASV, "machine", "--yes", *extra, check=False, capture=True)
        if result.returncode != 0:
            raise UserError(f"asv machine --yes failed: {(result.stderr or result.stdout).strip()}")
    return name


def asv_run(commits, machine, *options, config=None, skip_existing=True):
    """``asv run [--config CONFIG] HASHFILE:... [--skip-existing] --record-samples --machine MACHINE OPTIONS``: asv's
    exit code (0 without commits)."""
    if not commits:
        return 0
    hashfile = ROOT / ".asv" / "commits-to-run.txt"
    hashfile.parent.mkdir(exist_ok=True)
    hashfile.write_text("\n".join(commits) + "\n")
    return run(*ASV, "run", *(["--config", config] if config else []), f"HASHFILE:{hashfile}",
               *(["--skip-existing"] if skip_existing else []), "--record-samples", "--machine", machine, *options,
               check=False)


def answers_config():
    """The path of ``.asv/answers.conf.json``, written: asv.conf.json with ``answers/`` for its benchmarks and results
    in ``.asv/answers``, the environments shared. Paired ratios move with the load between runs, so they are kept
    out of what ``asv compare`` and the Regressions page read (docs/benchmarking.md)."""
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "answers"), env_dir=str(ROOT / conf["env_dir"]),
                results_dir=str(ROOT / ".asv" / "answers"), html_dir=str(ROOT / ".asv" / "html-answers"))
    path = ROOT / ".asv" / "answers.conf.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(conf, indent=4) + "\n")
    return path


@contextlib.contextmanager
def workspace_lock(command):
    """One job at a time in ``.asv/``: ``fcntl.flock`` on ``.asv/lock``, waited for (the kernel drops it on exit)."""
    path = ROOT / ".asv" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {os.pread(fd, 200, 0).decode(errors='replace') or 'another job'} to finish: it "
                  f"holds {path}", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({command})".encode(), 0)
        yield
    finally:
        os.close(fd)
