"""SIGTERM and SIGINT stop a command and every process it started (tools/processes.py), with a fake asv that sleeps.

The fake asv does what asv does: it starts a "benchmark process" in a process
group of its own (``os.setpgid(0, 0)``, as ``asv.util.check_output``), plus one
in a session of its own (as a nested ``tools/dev.py`` would), and sleeps. Before
issue 12, SIGTERM to the command left all three running with parent PID 1. SIGKILL
of a command that runs such a command (``noise`` running the clone's ``gate``)
left the inner one and all three running, until the child asked the kernel for
SIGTERM at its parent's death.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tools import common, processes

REPOSITORY = common.ROOT

FAKE_ASV = """
import os, signal, subprocess, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
group = subprocess.Popen(sleep, preexec_fn=lambda: os.setpgid(0, 0))
session = subprocess.Popen(sleep, start_new_session=True)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {group.pid} {session.pid}")
time.sleep(600)
"""
# the command, as tools/dev.py runs it, with asv replaced by the fake
DRIVER = """
import sys
from tools import common, dev, processes
common.ROOT = __import__("pathlib").Path(sys.argv[1])
common.ASV = (sys.executable, sys.argv[2], sys.argv[3], sys.argv[4])
processes.GRACE = 2.0
sys.exit(dev.main(["publish"]))
"""


def alive(pid):
    """True if ``pid`` runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_job(tmp_path, mode="plain"):
    (tmp_path / "fake_asv.py").write_text(FAKE_ASV)
    pids = tmp_path / "pids"
    job = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(tmp_path / "fake_asv.py"), str(pids),
                            mode], cwd=REPOSITORY, env={**os.environ, common.INSIDE_VENV: "1"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 3):
        assert time.monotonic() < deadline and job.poll() is None, job.communicate()
        time.sleep(0.05)
    return job, [int(p) for p in pids.read_text().split()]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="process trees are read from /proc")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_command_and_every_process_it_started(tmp_path, signum, code):
    job, pids = start_job(tmp_path)
    assert all(alive(p) for p in pids)
    job.send_signal(signum)
    _, err = job.communicate(timeout=60)
    assert job.returncode == code
    assert err.strip().splitlines()[-1] == (f"tools/dev.py publish: stopped by {signal.Signals(signum).name}, "
                                            f"with every process it started (exit {code})")  # after asv's own
    deadline = time.monotonic() + 10  # re-parented processes are reaped by init a moment later
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []
    assert not (tmp_path / ".asv" / "lock").read_bytes()  # the lock was released on the way out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="process trees are read from /proc")
def test_a_child_that_ignores_the_signal_is_killed_after_the_grace_period(tmp_path):
    job, pids = start_job(tmp_path, "stubborn")
    started = time.monotonic()
    job.send_signal(signal.SIGTERM)
    job.communicate(timeout=60)
    assert job.returncode == 143 and time.monotonic() - started >= 2.0  # GRACE, then SIGKILL
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


def test_run_returns_what_subprocess_run_would():
    result = processes.run([sys.executable, "-c", "import os, sys; print(os.getsid(0) == os.getpid()); "
                            "sys.exit(3)"], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (3, "True\n")  # in a session of its own


def test_outside_the_main_thread_signals_are_left_alone():
    import threading

    handlers = []

    def body():
        with processes.handle_signals():
            handlers.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert handlers == [signal.getsignal(signal.SIGTERM)]
    with processes.handle_signals():
        assert signal.getsignal(signal.SIGTERM) is not handlers[0]
    assert signal.getsignal(signal.SIGTERM) is handlers[0]


# the drill (tools/dev.py noise), as it runs the clone's gate: through processes.run, here with the DRIVER above
DRILL = """
import sys
from tools import processes
processes.run([sys.executable, "-c", *sys.argv[1:]])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_of_the_parent_stops_the_child_and_every_process_it_started(tmp_path):
    """SIGKILL cannot be forwarded: the child learns of its parent's death from the kernel (PR_SET_PDEATHSIG)
    as SIGTERM, and stops its own processes as on any SIGTERM."""
    (tmp_path / "fake_asv.py").write_text(FAKE_ASV)
    pids = tmp_path / "pids"
    drill = subprocess.Popen([sys.executable, "-c", DRILL, DRIVER, str(tmp_path),
                              str(tmp_path / "fake_asv.py"), str(pids), "plain"], cwd=REPOSITORY,
                             env={**os.environ, common.INSIDE_VENV: "1"}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 3):
        assert time.monotonic() < deadline and drill.poll() is None, drill.communicate()
        time.sleep(0.05)
    gate = [p for p in processes.tree(drill.pid) if p != drill.pid]  # the driver, fake asv and its two children
    assert len(gate) == 4 and all(alive(p) for p in gate)
    drill.kill()
    drill.wait()
    try:
        deadline = time.monotonic() + 10  # SIGTERM at once: asv's processes stop within a moment (GRACE is 2 s)
        while any(alive(p) for p in gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in gate if alive(p)] == []
    finally:  # none left behind, whatever the outcome
        processes._signal([p for p in gate if alive(p)], signal.SIGKILL)
    assert not (tmp_path / ".asv" / "lock").read_bytes()  # the child stopped as on SIGTERM: its lock released


ASKED = ("import ctypes, sys; libc = ctypes.CDLL(None); signum = ctypes.c_int(-1); "
         "libc.prctl(2, ctypes.byref(signum), 0, 0, 0); print(signum.value)")  # PR_GET_PDEATHSIG


def no_libc(*args, **kwargs):
    raise OSError("no libc here")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("where, asked", [("linux", signal.SIGTERM), ("macOS", 0), ("no libc", 0)])
def test_the_child_asks_for_sigterm_at_its_parents_death_where_prctl_exists(monkeypatch, where, asked):
    """Where there is no prctl (not Linux, or no libc to load), the child starts as before, without the request."""
    if where == "macOS":
        monkeypatch.setattr(sys, "platform", "darwin")
    if where == "no libc":
        monkeypatch.setattr(processes.ctypes, "CDLL", no_libc)
    result = processes.run([sys.executable, "-c", ASKED], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, f"{int(asked)}\n")
