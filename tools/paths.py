"""Where ``report csv --out`` and ``report plots --out`` may write: where nothing is or a regular file is (``lstat``,
the folders' symlinks resolved: never through a symlink, FIFO, device, socket or directory), whole or not at all.
"""

import contextlib
import os
import stat
import tempfile

from .common import UserError

KINDS = {stat.S_IFREG: "a regular file", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}


def kind(mode):
    """What a file of ``mode`` is, in words (``a FIFO``)."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _lstat(out, what):
    """``(the path with its folders' symlinks resolved, its lstat mode or None where nothing is)``."""
    if not os.fspath(out):
        raise UserError(f"{what}: the path is empty")
    real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(out))), os.path.basename(out))
    try:
        return real, os.lstat(real).st_mode
    except FileNotFoundError:
        return real, None
    except OSError as exc:
        raise UserError(f"cannot write {what}: {exc.strerror}") from None


def check_file(out, what=None):
    """The path to write for ``out``; UserError where it is anything but nothing or a regular file."""
    what = what or f"--out {out}"
    real, mode = _lstat(out, what)
    if mode is not None and not stat.S_ISREG(mode):
        raise UserError(f"{what} is {kind(mode)}, not a regular file: refusing to write through it")
    return real


def check_dir(out):
    """The directory ``out`` (made if missing) files may be written into; UserError if it may not."""
    real, mode = _lstat(out, f"--out {out}")
    if mode is not None and not stat.S_ISDIR(mode):
        raise UserError(f"--out {out} is {kind(mode)}, not a directory")
    try:
        os.makedirs(real, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create --out {out}: {exc.strerror}") from None
    return real


@contextlib.contextmanager
def atomic_write(real, binary=False):
    """A file object writing a temporary file next to ``real``, renamed over ``real`` if the block succeeds."""
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".tmp-", suffix="-" + os.path.basename(real))
    except OSError as exc:
        raise UserError(f"cannot write {real}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o644)  # as open() makes it under the usual umask, not mkstemp's 0600
        text = {} if binary else {"newline": "", "errors": "surrogateescape"}  # a name of bytes, not UTF-8: as it is
        with os.fdopen(fd, "wb" if binary else "w", **text) as f:
            yield f
        os.replace(tmp, real)
    except OSError as exc:
        raise UserError(f"cannot write {real}: {exc.strerror}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
