"""Where a command may write a file the user named (``report csv --out``, ``report plots --out``).

One rule for every command that writes files: a path is written only if it is
a regular file or does not exist yet, checked twice, on the path as given and
on the path with every symlink resolved (the file is then written at the
resolved place, so an existing symlink keeps pointing at it). Refused with one
line (:class:`~tools.common.UserError`):

- a device, FIFO, socket or directory in its place;
- a read-only file;
- anything inside an asv workspace (a directory named ``.asv``, or another
  protected directory such as the results directory in use) or inside a
  ``.git`` directory;
- a file git tracks (``git ls-files``) in the repository it lies in.

A file is written whole or not at all: into a temporary file in the same
directory, then renamed over the target (``os.replace``), so a reader never
sees half of it and a failure leaves the old file as it was. Replacing an
existing file keeps its permission bits, and the command says it replaced it.
"""

import contextlib
import os
import stat
import subprocess
import tempfile

from . import common
from .common import UserError

KINDS = {stat.S_IFREG: "a regular file", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}


def kind(mode):
    """What a file of ``mode`` is, in words (``a FIFO``)."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


SYSTEM_DIRS = ("/dev", "/proc", "/sys")  # the kernel's and devices' file systems: never an output


def _check_given(out, what):
    """UserError for an empty path, or one in :data:`SYSTEM_DIRS` as given or resolved."""
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise UserError(f"{what}: the path is empty")
    given, real = os.path.abspath(out), os.path.realpath(out)
    for path, label in ((given, what), (real, f"{what} (resolved to {real})")):
        system = [d for d in SYSTEM_DIRS if _inside(path, d)]
        if system:
            raise UserError(f"{label} is inside {system[0]}, the system's device and kernel files: choose another path")


def _inside(path, folder):
    return os.path.commonpath([path, folder]) == folder


def _git_says(existing_dir, *args):
    """True if ``git -C existing_dir ARGS`` succeeds and prints ``true`` or a path; False without git."""
    try:
        out = subprocess.run(["git", "--literal-pathspecs", "-C", existing_dir, *args], capture_output=True,
                             text=True)
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() not in ("", "false")


def _nearest_existing(path):
    """``(the deepest existing directory above path, path relative to it)``."""
    folder = os.path.dirname(path)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    return folder, os.path.relpath(path, folder)


def _check_workspace(path, what, protected):
    """UserError if ``path`` lies in a protected directory or any ``.asv`` directory."""
    parts = path.split(os.sep)
    inside = [folder for folder in protected if _inside(path, folder)]
    if ".asv" in parts:
        inside.append(os.sep.join(parts[:parts.index(".asv") + 1]))
    if inside:
        raise UserError(f"{what} is inside {inside[0]}, which only asv and these tools write: choose another path")


def _check_place(path, what, protected):
    """UserError if ``path`` (absolute, normalised) lies in a protected directory, a .git directory or is tracked."""
    _check_workspace(path, what, protected)
    folder, rest = _nearest_existing(path)
    if ".git" in path.split(os.sep) or _git_says(folder, "rev-parse", "--is-inside-git-dir"):
        raise UserError(f"{what} is inside a .git directory: choose another path")
    if _git_says(folder, "ls-files", "--full-name", "--", rest):
        raise UserError(f"{what} is a file git tracks: choose a path that is not part of the repository")


def protected_dirs(*extra):
    """The directories no output may be written into: this repository's ``.asv/`` and ``extra``, resolved."""
    dirs = [common.ROOT / ".asv", *extra]
    return sorted({os.path.realpath(d) for d in dirs} | {os.path.abspath(d) for d in dirs})


def check_file(out, protected=(), what=None):
    """The resolved path ``out`` may be written to, and whether a file is there already.

    Raises:
        UserError: ``out`` (as given or resolved) is not a regular file nor a
            missing path, is read-only, protected, inside .git or tracked.
    """
    what = what or f"--out {out}"
    _check_given(out, what)
    protected = protected_dirs(*protected)
    given, real = os.path.abspath(out), os.path.realpath(out)
    _check_place(given, what, protected)
    if real != given:
        _check_place(real, f"{what} (resolved to {real})", protected)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return real, False
    except OSError as exc:
        raise UserError(f"cannot write {what}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        resolved = "" if real == given else f" (resolved to {real})"
        raise UserError(f"{what}{resolved} is {kind(info.st_mode)}, not a regular file: refusing to replace it")
    if not os.access(real, os.W_OK) or not info.st_mode & 0o222:
        raise UserError(f"{what} is a read-only file: refusing to replace it")
    return real, True


@contextlib.contextmanager
def atomic_write(real, binary=False):
    """Yield a file object writing a temporary file next to ``real``; renamed over ``real`` if the block succeeds.

    ``real`` is a path :func:`check_file` returned; missing parent directories
    are made. Raises UserError when the file cannot be written.
    """
    folder = os.path.dirname(real)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + os.path.basename(real))
    except OSError as exc:
        raise UserError(f"cannot write {real}: {exc.strerror}") from None
    try:
        try:
            mode = stat.S_IMODE(os.stat(real).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # as open() would make it, not mkstemp's 0600
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb" if binary else "w", newline=None if binary else "") as f:
            yield f
        os.replace(tmp, real)
    except OSError as exc:
        raise UserError(f"cannot write {real}: {exc.strerror}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def check_dir(out, protected=(), what=None):
    """The resolved directory ``out`` (existing, or to be made) that files may be written into.

    Raises:
        UserError: ``out`` (as given or resolved) exists and is not a directory,
            or lies in a protected directory or inside .git.
    """
    what = what or f"--out {out}"
    _check_given(out, what)
    protected = protected_dirs(*protected)
    given, real = os.path.abspath(out), os.path.realpath(out)
    for path in {given, real}:
        _check_workspace(path, what, protected)
        if ".git" in path.split(os.sep):
            raise UserError(f"{what} is inside a .git directory: choose another directory")
    if os.path.lexists(real) and not os.path.isdir(real):
        raise UserError(f"{what} is {kind(os.lstat(real).st_mode)}, not a directory")
    try:
        os.makedirs(real, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {what}: {exc.strerror}") from None
    return real
