"""tools/dev.py: its command line, parsed before .venv exists, and the arguments it passes through."""

import os
import subprocess
import sys

import pytest

from tools import common, dev

DEV_PY = common.ROOT / "tools" / "dev.py"


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["bench", "--bogus"], ["bench", "--al"], ["bench", "--commits", "1"],
                                  ["noise", "history", "--library-commits", "-1"],
                                  ["noise", "history", "--library-commits", "0"],
                                  ["noise", "history", "--library-commits", "100000000"],
                                  ["bench", "--machine", "../../docs/results/vm"], ["bench", "--machine", ""],
                                  ["report", "tables", "--machine", "a/b"]])
def test_bad_command_lines_exit_2_without_a_traceback(argv):
    result = subprocess.run([sys.executable, str(DEV_PY), *argv], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: tools/dev.py" in result.stderr and "Traceback" not in result.stderr


def test_test_passes_its_arguments_through_and_report_parses_its_own():
    args = dev.parse_args(["report", "compare", "HEAD~1", "HEAD", "--machine", "vm"])
    assert (args.command, args.report_command, args.base, args.head, args.machine) == (
        "report", "compare", "HEAD~1", "HEAD", "vm")
    args = dev.parse_args(["test", "-k", "cache", "-x"])
    assert args.command == "test" and args.rest == ["-k", "cache", "-x"]
    for argv in (["gate", "HEAD~1", "HEAD", "--bogus"], ["report", "tables", "--bogus"]):
        with pytest.raises(SystemExit):
            dev.parse_args(argv)


def test_test_runs_only_the_node_ids_and_paths_it_is_given():
    """``tools/dev.py test NODE_ID`` collects that test alone, and without paths the whole suite (testpaths)."""
    env = {**os.environ, common.INSIDE_VENV: "1"}

    def collected(*argv):
        result = subprocess.run([sys.executable, "-m", "tools.dev", "test", "--collect-only", "-q",
                                 "-p", "no:cacheprovider", *argv], cwd=common.ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return [line for line in result.stdout.splitlines() if "::" in line]

    node = "tests/tools/test_dev.py::test_test_passes_its_arguments_through_and_report_parses_its_own"
    assert collected(node) == [node]
    assert set(collected("tests/tools/test_lock.py")) == {n for n in collected("tests/tools") if "test_lock.py" in n}
    whole = collected()
    assert node in whole and any(n.startswith("tests/kv_attention/") for n in whole)
