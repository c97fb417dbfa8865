"""Child processes that stop when the command is stopped: SIGTERM and SIGINT reach every process it started.

``timeout``, a CI scheduler or Ctrl-C send SIGTERM or SIGINT to the command.
Within :func:`handle_signals` (``tools/dev.py`` runs every command in it) both
raise :class:`Stopped` in the command, so its ``finally`` blocks run (the
workspace lock is released, temporary clones are removed). :func:`run` starts
every child in a session of its own and, when stopped, forwards the signal to
the child and to every process under it. asv starts each benchmark process in a process group of its
own, so signalling asv's group alone would orphan them; they stay in asv's
session and under its process tree, which is what is signalled here. What does
not exit within :data:`GRACE` seconds is killed (SIGKILL). The command then
exits 128 + the signal's number: 143 for SIGTERM, 130 for SIGINT.

SIGKILL cannot be caught, so it cannot be forwarded: on Linux every child
:func:`run` starts asks the kernel for SIGTERM when this process dies
(``prctl(PR_SET_PDEATHSIG)``, :func:`_parent_death_signal`), however it dies.
A child that is itself a ``tools/dev.py`` command (the clone's ``gate`` that
``noise`` runs) then stops as on any SIGTERM, with every process it started.
Without prctl (not Linux, or no libc to load) the children outlive a SIGKILLed
command, as before.

Process trees are read from ``/proc`` (Linux); elsewhere the child's process
group is signalled.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

GRACE = 10.0  # seconds a stopped child and its processes get to exit before SIGKILL
SIGNALS = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1  # prctl(2)'s option: the signal a process gets when its parent dies (<linux/prctl.h>)


class Stopped(BaseException):
    """The command received SIGTERM or SIGINT (a BaseException, like KeyboardInterrupt: not caught as an error)."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self):
        return 128 + self.signum


_stopping = []  # the signal that stops the command, once received


def _raise_stopped(signum, frame):
    if _stopping:  # a second signal while the children stop: they are killed at once
        _stopping.append(signum)
        return
    _stopping.append(signum)
    raise Stopped(signum)


@contextlib.contextmanager
def handle_signals():
    """Within the block, SIGTERM and SIGINT raise :class:`Stopped` (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stopping.clear()
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _proc_table():
    """``{pid: (parent pid, session id, state)}`` of every process, from /proc; None without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, session, ...
        table[int(name)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def _live(table, pids):
    return {p for p in pids if p in table and table[p][2] != "Z"}


def tree(pid, table=None):
    """``pid`` and the live processes under it or in its session (no zombies); ``{pid}`` without /proc."""
    table = _proc_table() if table is None else table
    if table is None:
        return {pid}
    members = {p for p, (_, session, _) in table.items() if session == pid} | {pid}
    while True:  # and their descendants, also those in sessions of their own
        below = {p for p, (parent, _, _) in table.items() if parent in members} - members
        if not below:
            return _live(table, members)
        members |= below


def _signal(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def stop(proc, signum):
    """Send ``signum`` to ``proc`` and every process under it; SIGKILL what is left after GRACE seconds.

    The processes under ``proc`` are followed after it exits and they are
    re-parented; one started meanwhile in its session is signalled too.
    """
    members = tree(proc.pid)  # before the signal: once asv dies, its children are re-parented
    try:
        os.killpg(proc.pid, signum)  # the child's own group: the one signal there is without /proc
    except (ProcessLookupError, PermissionError):
        pass
    _signal(members, signum)
    deadline = time.monotonic() + GRACE
    while True:
        table = _proc_table()
        proc.poll()
        if table is None:
            members = set() if proc.returncode is not None else {proc.pid}
        else:
            new = tree(proc.pid, table) - members  # started meanwhile (its session outlives it)
            _signal(new, signum)
            members = _live(table, members | new)
        if not members or time.monotonic() > deadline or len(_stopping) > 1:
            break
        time.sleep(0.05)
    _signal(members, signal.SIGKILL)
    proc.wait()


def _libc_prctl():
    """libc's ``prctl``, typed; None where there is none (not Linux, or no libc to load)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _parent_death_signal():
    """A ``preexec_fn``: in the child, before exec, SIGTERM is asked for when this process dies; None without prctl.

    The setting survives exec (and ``tools/dev.py``'s re-exec into .venv). The
    kernel sends it when the thread that started the child ends: :func:`run` is
    called from the main thread. A parent that died before the setting took effect
    (the child is then another's) is answered with the same SIGTERM at once.
    """
    prctl = _libc_prctl()  # loaded here, in the parent: the child only calls it
    if prctl is None:
        return None
    parent = os.getpid()

    def ask():
        if prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0 and os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return ask


def run(command, *, cwd=None, env=None, capture_output=False, stdout=None, stderr=None, text=False, lines=None):
    """``subprocess.run`` in a session of its own; on :class:`Stopped` (or Ctrl-C) the child's tree is stopped.

    ``lines``, if given, is called with each line the command prints (stdout and
    stderr together, as text) as it prints it. The child gets SIGTERM if this process
    dies unannounced (:func:`_parent_death_signal`). Returns a ``subprocess.CompletedProcess``.
    """
    if capture_output:
        stdout = stderr = subprocess.PIPE
    if lines is not None:
        stdout, stderr, text = subprocess.PIPE, subprocess.STDOUT, True
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text,
                            start_new_session=True, preexec_fn=_parent_death_signal())
    try:
        if lines is None:
            out, err = proc.communicate()
        else:
            for line in proc.stdout:
                lines(line)
            out, err = None, None
            proc.wait()
    except Stopped as stopped:
        stop(proc, stopped.signum)
        raise
    except BaseException:  # KeyboardInterrupt where handle_signals() was not called, or any error
        stop(proc, signal.SIGINT)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
