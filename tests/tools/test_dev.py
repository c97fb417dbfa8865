"""tools/dev.py: its command line, parsed before .venv exists, and the arguments it passes through."""

import os
import shlex
import subprocess
import sys

import pytest

from tools import common, dev, examples

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
    lock_tests = collected("tests/tools/test_lock.py")
    assert len(lock_tests) > 1 and all(n.startswith("tests/tools/test_lock.py::") for n in lock_tests)
    whole = collected()  # no path: setup.cfg's testpaths, the whole suite
    assert node in whole and any(n.startswith("tests/kv_attention/") for n in whole)


def example_argv(line):
    """The arguments of an example command line after ``python3 tools/dev.py``, its comment cut."""
    words = shlex.split(line.split("   #")[0])
    assert words[:2] == ["python3", "tools/dev.py"], line
    return words[2:]


def test_every_subcommand_s_help_ends_with_examples_that_parse():
    """Issue 20: report compare, csv and plots printed only argparse's "required" line, and no example."""
    commands = examples.subcommands(dev.make_parser()[0])
    assert {"bench", "test", "gate", "bisect", "report compare", "report csv", "report plots", "noise aa",
            "publish", "browser-check"} <= set(commands)
    for command, parser in commands.items():
        lines = examples.EXAMPLES.get(command)
        assert lines, f"{command!r} has no example"
        if command != "test":  # test's --help is pytest's, after the example (test_test_help_shows_its_example)
            assert parser.format_help().rstrip().endswith(lines[-1]), command
        for line in lines:
            argv = example_argv(line)
            assert " ".join(argv).startswith(command), line
            dev.parse_args(argv)  # exits 2 on a usage error


@pytest.mark.parametrize("argv", [["report", "compare"], ["report", "csv"], ["report", "plots"], ["gate"],
                                  ["report", "tables", "--bogus"], ["noise"]])
def test_a_usage_error_shows_a_working_example_then_the_error_line(argv):
    result = subprocess.run([sys.executable, str(DEV_PY), *argv], capture_output=True, text=True)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"usage: tools/dev.py {' '.join(a for a in argv if not a.startswith('-'))}")
    assert lines[-1].startswith(f"tools/dev.py {' '.join(a for a in argv if not a.startswith('-'))}: error: ")
    shown = [line.strip() for line in lines if line.startswith("  python3 tools/dev.py")]
    command = " ".join(a for a in argv if not a.startswith("-"))
    assert shown == examples.EXAMPLES[command]


def test_test_help_shows_its_example_before_pytest_s_help():
    result = subprocess.run([sys.executable, "-m", "tools.dev", "test", "--help"], cwd=common.ROOT,
                            env={**os.environ, common.INSIDE_VENV: "1"}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "[file_or_dir]" in result.stdout  # pytest's help
    assert result.stdout.index(examples.EXAMPLES["test"][1]) < result.stdout.index("[file_or_dir]")


def test_the_examples_on_the_stored_results_work_on_a_fresh_clone(monkeypatch, tmp_path, capsys):
    """Every report example on docs/results runs as typed (its --out put in a temporary folder)."""
    monkeypatch.chdir(common.ROOT)
    monkeypatch.setenv(common.INSIDE_VENV, "1")
    ran = 0
    for command, lines in examples.EXAMPLES.items():
        for line in lines:
            argv = example_argv(line)
            if "docs/results" not in argv or argv[0] != "report":
                continue
            if "--out" in argv:
                i = argv.index("--out") + 1
                argv[i] = str(tmp_path / argv[i])
            assert dev.main(argv) == 0, line
            ran += 1
    out = capsys.readouterr().out
    assert ran >= 4 and "## kv-attention decode benchmarks at `4fbab830` on `vm-f980c2bd`" in out  # the stored run
    assert (tmp_path / "samples.csv").stat().st_size > 0 and list((tmp_path / "plots").glob("*.png"))
