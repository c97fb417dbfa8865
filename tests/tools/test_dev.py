"""tools/dev.py's command line: one-line usage errors, pytest's arguments passed through, the workspace lock."""

import fcntl
import os
import subprocess
import sys

import pytest

from tools import common, dev

DEV_PY = common.ROOT / "tools" / "dev.py"


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["bench", "--bogus"], ["bench", "--al"],
                                  ["bench", "--commits", "1"], ["gate", "HEAD", "HEAD", "--factor", "0.9"]])
def test_bad_command_lines_exit_2_without_a_traceback(argv):
    result = subprocess.run([sys.executable, str(DEV_PY), *argv], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: tools/dev.py" in result.stderr and "Traceback" not in result.stderr


def test_test_passes_its_arguments_through_and_report_parses_its_own():
    args = dev.parse_args(["report", "tables", "--commit", "HEAD~1", "--machine", "vm"])
    assert (args.command, args.report_command, args.commit, args.machine) == ("report", "tables", "HEAD~1", "vm")
    args = dev.parse_args(["test", "-k", "cache", "-x"])
    assert args.command == "test" and args.rest == ["-k", "cache", "-x"]
    with pytest.raises(SystemExit):
        dev.parse_args(["gate", "HEAD~1", "HEAD", "--bogus"])


def test_an_unknown_commit_is_one_line_and_exit_2_for_the_gate():
    result = subprocess.run([sys.executable, "-m", "tools.dev", "gate", "nosuchcommit", "HEAD"], cwd=common.ROOT,
                            env={**os.environ, common.INSIDE_VENV: "1"}, capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr == (
        "tools/dev.py gate: error: 'nosuchcommit' is not a commit of this repository\n")


def test_a_second_job_waits_for_the_workspace_lock(repo, capsys):
    with common.workspace_lock("tools/dev.py bench"):
        fd = os.open(repo.root / ".asv" / "lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):  # held: another job's flock would wait
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert os.pread(fd, 200, 0).decode() == f"pid {os.getpid()} (tools/dev.py bench)"
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the job ends
    os.close(fd)
