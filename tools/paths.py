"""Where a command may write a file the user named (``report csv --out``, ``report plots --out``).

Only where nothing is yet or a regular file is (``lstat``: never through a symlink, a FIFO, a device, a socket or
a directory), and never inside an asv workspace (``.asv``, or the results read), ``.git``, /dev, /proc or /sys, as
given or with its folders' symlinks resolved. A file is written whole or not at all: a temporary file renamed over it.
"""

import contextlib
import os
import stat
import tempfile

from . import common
from .common import UserError

KINDS = {stat.S_IFREG: "a regular file", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}


def kind(mode):
    """What a file of ``mode`` is, in words (``a FIFO``)."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _check_place(out, what, protected):
    if not os.fspath(out):
        raise UserError(f"{what}: the path is empty")
    given = os.path.abspath(out)
    real = os.path.join(os.path.realpath(os.path.dirname(given)), os.path.basename(given))
    folders = {os.path.realpath(d) for d in [common.ROOT / ".asv", "/dev", "/proc", "/sys", *protected]}
    for path in (given, real):
        parts = path.split(os.sep)
        inside = [d for d in folders if os.path.commonpath([path, d]) == d]
        inside += [os.sep.join(parts[:parts.index(d) + 1]) for d in (".asv", ".git") if d in parts]
        if inside:
            raise UserError(f"{what} is inside {inside[0]} (asv's workspace, the results read, .git or the "
                            "system's devices): choose another path")
    return real


def check_file(out, protected=(), what=None):
    """``(path to write, whether a file is there already)``; UserError where ``out`` may not be written."""
    what = what or f"--out {out}"
    real = _check_place(out, what, protected)
    try:
        mode = os.lstat(real).st_mode
    except FileNotFoundError:
        return real, False
    except OSError as exc:
        raise UserError(f"cannot write {what}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} is {kind(mode)}, not a regular file: refusing to write through it")
    return real, True


@contextlib.contextmanager
def atomic_write(real, binary=False):
    """A file object writing a temporary file next to ``real``, renamed over ``real`` if the block succeeds."""
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".tmp-", suffix="-" + os.path.basename(real))
    except OSError as exc:
        raise UserError(f"cannot write {real}: {exc.strerror}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb" if binary else "w", newline=None if binary else "") as f:
            yield f
        os.replace(tmp, real)
    except OSError as exc:
        raise UserError(f"cannot write {real}: {exc.strerror}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def check_dir(out, protected=(), what=None):
    """The directory ``out`` (made if missing) files may be written into; UserError if it may not."""
    what = what or f"--out {out}"
    real = _check_place(out, what, protected)
    if os.path.lexists(real) and not stat.S_ISDIR(os.lstat(real).st_mode):
        raise UserError(f"{what} is {kind(os.lstat(real).st_mode)}, not a directory")
    try:
        os.makedirs(real, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {what}: {exc.strerror}") from None
    return real
