"""The workspace lock (tools/lock.py): a second job waits for the first and names it; a killed holder's lock is
taken over. The holder is a real process of its own, as a second main job would be."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tools import common, lock
from tools.commands import COMMANDS

REPOSITORY = common.ROOT  # where tools/ is importable from (tests point common.ROOT elsewhere)

HOLD = """
import sys, time
from pathlib import Path
from tools import common, lock
common.ROOT = Path(sys.argv[1])
with lock.workspace(sys.argv[2]):
    print("holding", flush=True)
    time.sleep(float(sys.argv[3]))
print("released", flush=True)
"""


def start(root, name, seconds):
    """A process that takes the lock of ``root`` as job ``name`` and holds it ``seconds``; returns it once it holds
    the lock or waits for it (its first line)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), name, str(seconds)], cwd=REPOSITORY,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.first_line = proc.stdout.readline()
    return proc


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "ROOT", tmp_path)
    return tmp_path


def test_a_second_job_waits_naming_the_holder_then_runs(root):
    first = start(root, "tools/dev.py bench", 600)
    assert first.first_line == "holding\n"
    second = start(root, "tools/dev.py gate", 0)
    try:
        assert second.first_line.startswith(f"waiting for pid {first.pid} (tools/dev.py bench, since ")
        assert f"it holds the workspace lock {root / '.asv' / 'lock'}" in second.first_line
        time.sleep(1.0)
        assert second.poll() is None  # still waiting
    finally:
        first.send_signal(signal.SIGTERM)  # a job that ends (even by a signal) releases the lock
    rest = second.communicate(timeout=30)[0]
    assert second.returncode == 0 and rest.splitlines()[-2:] == ["holding", "released"]
    first.communicate(timeout=30)


def test_a_lock_left_by_a_killed_job_is_taken_over_with_a_message(root):
    first = start(root, "tools/dev.py bench", 600)
    assert first.first_line == "holding\n"
    first.send_signal(signal.SIGKILL)  # no finally: its record stays in the lock file, the kernel drops the flock
    first.communicate(timeout=30)
    second = start(root, "tools/dev.py bench", 0)
    assert second.first_line.startswith(f"note: took over the workspace lock {root / '.asv' / 'lock'} from pid "
                                        f"{first.pid} (tools/dev.py bench, since ")
    assert "ended without releasing it" in second.first_line
    assert second.communicate(timeout=30)[0] == "holding\nreleased\n" and second.returncode == 0


def test_a_lock_released_normally_leaves_nothing_to_report(root, capsys):
    with lock.workspace("first"):
        assert b'"command": "first"' in (root / ".asv" / "lock").read_bytes()
    assert (root / ".asv" / "lock").read_bytes() == b""
    with lock.workspace("second"):
        pass
    assert capsys.readouterr().out == ""


def test_a_lock_file_that_is_a_symlink_or_a_fifo_is_refused(root, tmp_path_factory):
    (root / ".asv").mkdir()
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "file"
    (root / ".asv" / "lock").symlink_to(elsewhere)
    with pytest.raises(common.UserError, match="is a symlink"):
        with lock.workspace("job"):
            pass
    assert not elsewhere.exists()
    (root / ".asv" / "lock").unlink()
    os.mkfifo(root / ".asv" / "lock")
    with pytest.raises(common.UserError, match="not a regular file"):
        with lock.workspace("job"):
            pass


def test_every_command_that_measures_or_publishes_takes_the_lock():
    locking = {module.__name__.rsplit(".", 1)[-1] for module in COMMANDS if getattr(module, "LOCKS_WORKSPACE", False)}
    assert locking == {"bench", "gate", "bisect", "noise", "publish", "browser_check"}  # not test, not report (read-only)


def test_dev_holds_the_lock_while_a_locking_command_runs(root):
    from types import SimpleNamespace

    from tools import dev

    seen = []
    module = SimpleNamespace(LOCKS_WORKSPACE=True, run=lambda args: seen.append(
        (root / ".asv" / "lock").read_text()) or 0)
    assert dev.run_command(SimpleNamespace(module=module, command="fake")) == 0
    assert '"command": "tools/dev.py fake"' in seen[0] and f'"pid": {os.getpid()}' in seen[0]
