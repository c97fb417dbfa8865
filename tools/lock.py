"""One job at a time in the asv workspace: an exclusive ``flock`` on ``.asv/lock``.

Two main jobs (or a main job and a gate, a noise drill, a publish or a browser
check) would install different commits into the same asv environments and
publish into the same ``.asv/html``. Every command that does either holds the
lock while it runs (``LOCKS_WORKSPACE = True`` in its module; ``tools/dev.py``
takes it). A second one **waits** for the first, saying which process holds
the lock: benchmark jobs are queued by CI and cron, and a job that waits costs
the running one no CPU, where one that refused would fail spuriously.

The lock is ``fcntl.flock`` on ``.asv/lock``: the kernel releases it when its
holder exits, however it exits, so a lock can never outlive its process. The
file also records the holder (pid, command, start time) for the messages; it
is emptied on a normal release, so a record found by the next holder is that
of a process that was killed, and is reported as taken over.
"""

import contextlib
import datetime
import errno
import fcntl
import json
import os
import stat
import sys

from . import common


def lock_path():
    return common.ROOT / ".asv" / "lock"


def _open(path):
    """The lock file's descriptor (created if missing); UserError if it is not a regular file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise common.UserError(f"{path} is a symlink: remove it (the workspace lock is a plain file)") from None
        raise common.UserError(f"cannot open the workspace lock {path}: {error.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise common.UserError(f"{path} is not a regular file: remove it (the workspace lock is a plain file)")
    return fd


def _holder(fd):
    """The record the holder wrote (``{"pid", "command", "started"}``), or None if empty or unreadable."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe(holder):
    """``pid 123 (tools/dev.py bench, since 2025-01-01 12:00:00 UTC)``."""
    if not holder:
        return "a process that has not said who it is yet"
    return f"pid {holder.get('pid')} ({holder.get('command')}, since {holder.get('started')})"


def _record(fd, command):
    record = {"pid": os.getpid(), "command": command,
              "started": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)


@contextlib.contextmanager
def workspace(command, out=None):
    """Hold the exclusive lock on ``.asv/`` for the block, waiting (with a message) while another job holds it.

    ``command`` names this job in the messages other jobs print.
    """
    out = out or sys.stdout
    path = lock_path()
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {describe(_holder(fd))} to finish: it holds the workspace lock {path}", file=out,
                  flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks; SIGTERM / SIGINT still stop the wait
            print("workspace lock acquired", file=out, flush=True)
        left = _holder(fd)
        if left and left.get("pid") != os.getpid():
            print(f"note: took over the workspace lock {path} from {describe(left)}, which ended without "
                  "releasing it (killed?)", file=out, flush=True)
        _record(fd, command)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released normally: nothing to report to the next holder
    finally:
        os.close(fd)  # closing the descriptor releases the flock
