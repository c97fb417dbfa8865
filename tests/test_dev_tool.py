"""tools/dev.py: which commits the main job benchmarks, and its command line."""

import subprocess
import sys

import pytest

from conftest import DEV_PY, PACKAGE


def test_default_selection_is_main_main_1_and_library_commits_that_build(dev):
    readme = dev.commit("readme only: no package yet", {"README.md": "x"})
    build = dev.commit("package", PACKAGE)
    docs = [dev.commit(f"docs {i}", {"README.md": f"doc {i}"}) for i in range(3)]
    library = dev.commit("library", {"kv_attention/decode.py": "# change"})
    main_1 = dev.commit("docs again", {"README.md": "again"})
    main = dev.commit("tests", {"tests/test_x.py": "# test"})
    selected = dev.select_commits(whole_history=False)
    assert selected == [main, main_1, library, build]
    assert readme not in dev.select_commits(whole_history=True)
    assert dev.select_commits(whole_history=True) == [main, main_1, library, *docs[::-1], build]


def test_every_commit_that_can_change_a_result_is_selected(dev):
    package = dev.commit("package", PACKAGE)
    library = [dev.commit(f"lib {i}", {"kv_attention/a.py": str(i)}) for i in range(12)]
    config = dev.commit("asv config", {"asv.conf.json": "{}"})
    dev.commit("benchmarks only", {"benchmarks/bench_x.py": "# x"})
    main_1 = dev.commit("docs", {"README.md": "x"})
    main = dev.commit("tests", {"tests/test_x.py": "# test"})
    assert dev.select_commits(whole_history=False) == [main, main_1, config, *library[::-1], package]


def test_a_merged_branch_counts_as_its_merge_commit_only(dev):
    """asv graphs main's first-parent history, so a branch's own commits are never selected."""
    package = dev.commit("package", PACKAGE)
    git = ["git", "-C", str(dev.ROOT), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["checkout", "-q", "-b", "topic"], check=True)
    topic = [dev.commit(f"topic {i}", {"kv_attention/t.py": str(i)}) for i in range(3)]
    subprocess.run(git + ["checkout", "-q", "main"], check=True)
    docs = dev.commit("docs on main", {"README.md": "x"})
    subprocess.run(git + ["merge", "-q", "--no-ff", "-m", "merge topic", "topic"], check=True)
    merge = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    main = dev.commit("tests", {"tests/test_x.py": "# test"})
    selected = dev.select_commits(whole_history=False)
    assert selected == [main, merge, package] and not set(topic) & set(selected)
    assert dev.select_commits(whole_history=True) == [main, merge, docs, package]


def test_no_buildable_commit_is_a_clear_error(dev):
    dev.commit("readme", {"README.md": "x"})
    with pytest.raises(dev.JobError, match="no commit of main has a buildable package"):
        dev.select_commits(whole_history=True)


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["bench", "--bogus"], ["bench", "--al"]])
def test_bad_command_lines_exit_2_without_a_traceback(argv):
    result = subprocess.run([sys.executable, str(DEV_PY), *argv], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: tools/dev.py" in result.stderr and "Traceback" not in result.stderr


def test_report_and_test_pass_their_arguments_through(dev):
    args = dev.parse_args(["report", "compare", "HEAD~1", "HEAD", "--machine", "vm"])
    assert args.command == "report" and args.rest == ["compare", "HEAD~1", "HEAD", "--machine", "vm"]
    args = dev.parse_args(["test", "-k", "cache", "-x"])
    assert args.command == "test" and args.rest == ["-k", "cache", "-x"]
    with pytest.raises(SystemExit):
        dev.parse_args(["gate", "HEAD~1", "HEAD", "--bogus"])
