"""What every command shares: the repository, git, asv's command line, the workspace lock, stopping children."""

import contextlib
import fcntl
import hashlib
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository; tests point it at a repository of their own
BRANCH = "main"
INSIDE_VENV = "KV_ATTENTION_DEV_VENV"  # set to "1" once a command runs inside .venv (tools/dev.py)
ASV = (sys.executable, "-m", "asv")  # asv of the Python running the command (.venv's)
GRACE = 10.0  # seconds the processes of a stopped child get before SIGKILL


class UserError(Exception):
    """A failure the user can fix: printed as one line (``<command>: error: ...``), never as a traceback."""


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the command (tools/dev.py turns both into this)."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def session(sid):
    """``{pid: process group}`` of the live processes of session ``sid``, from /proc (zombies left out)."""
    members = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()  # state ppid pgrp session
            if name.isdigit() and int(fields[3]) == sid and fields[0] != "Z":
                members[int(name)] = int(fields[2])
    return members


def stop(proc, signum):
    """``signum`` to every process group of ``proc``'s session (it was started in a new one); SIGKILL after GRACE."""
    deadline = time.monotonic() + GRACE
    sig = signum
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


def run(*command, check=True, lines=None, capture=False):
    """Run ``command`` from the repository root in a session of its own; its exit code (or CompletedProcess
    when ``capture``). On SIGTERM/SIGINT (:class:`Stopped`) its whole session is stopped too.

    ``lines``: called with every line it prints (stdout and stderr together), after the line is printed.
    """
    pipe = subprocess.PIPE if lines or capture else None
    proc = subprocess.Popen([str(c) for c in command], cwd=ROOT, start_new_session=True, text=True,
                            stdout=pipe, stderr=subprocess.STDOUT if lines else pipe)
    try:
        if lines:
            for line in proc.stdout:
                print(line, end="", flush=True)
                lines(line)
            out = err = None
            proc.wait()
        else:
            out, err = proc.communicate()
    except BaseException as error:
        stop(proc, error.signum if isinstance(error, Stopped) else signal.SIGINT)
        raise
    if check and proc.returncode != 0:
        raise UserError(f"`{' '.join(map(str, command))}` exited {proc.returncode}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err) if capture else proc.returncode


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


def machine_name():
    """``<hostname>-<8 hex digits>``: the hardware (CPU, count, architecture) and /etc/machine-id, hashed."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else ""
    ident = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").is_file() else ""
    text = "\n".join([cpu, str(os.cpu_count()), platform.machine(), ident])
    return f"{platform.node() or 'host'}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def record_machine(name=None):
    """``asv machine --yes --machine NAME`` (asv records hostname, CPU, RAM); returns NAME."""
    name = name or machine_name()
    result = run(*ASV, "machine", "--yes", "--machine", name, check=False, capture=True)
    if result.returncode != 0:
        raise UserError(f"asv machine --yes failed: {(result.stderr or result.stdout).strip()}")
    return name


def asv_run(commits, machine, *options, lines=None):
    """``asv run HASHFILE:... --record-samples --skip-existing --machine MACHINE OPTIONS``: asv's exit code."""
    hashfile = ROOT / ".asv" / "commits-to-run.txt"
    hashfile.parent.mkdir(exist_ok=True)
    hashfile.write_text("\n".join(commits) + "\n")
    return run(*ASV, "run", f"HASHFILE:{hashfile}", "--skip-existing", "--record-samples", "--machine", machine,
               *options, check=False, lines=lines)


@contextlib.contextmanager
def workspace_lock(command):
    """One job at a time in ``.asv/``: an exclusive ``fcntl.flock`` on ``.asv/lock``, waited for, with a message.

    The kernel drops it when the holder exits, however it exits.
    """
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
