"""The main job (tools/commands/bench.py): which commits it benchmarks."""

import pytest

from tools import common
from tools.commands import bench

from .conftest import PACKAGE


def test_default_selection_is_main_main_1_and_library_commits_that_build(repo):
    readme = repo.commit("readme only: no package yet", {"README.md": "x"})
    build = repo.commit("package", PACKAGE)
    docs = [repo.commit(f"docs {i}", {"README.md": f"doc {i}"}) for i in range(3)]
    library = repo.commit("library", {"kv_attention/decode.py": "# change"})
    main_1 = repo.commit("docs again", {"README.md": "again"})
    main = repo.commit("tests", {"tests/test_x.py": "# test"})
    selected = bench.select_commits(whole_history=False)
    assert selected == [main, main_1, library, build]
    assert readme not in bench.select_commits(whole_history=True)
    assert bench.select_commits(whole_history=True) == [main, main_1, library, *docs[::-1], build]


def test_every_commit_that_can_change_a_result_is_selected(repo):
    package = repo.commit("package", PACKAGE)
    library = [repo.commit(f"lib {i}", {"kv_attention/a.py": str(i)}) for i in range(12)]
    config = repo.commit("asv config", {"asv.conf.json": "{}"})
    repo.commit("benchmarks only", {"benchmarks/bench_x.py": "# x"})
    main_1 = repo.commit("docs", {"README.md": "x"})
    main = repo.commit("tests", {"tests/test_x.py": "# test"})
    assert bench.select_commits(whole_history=False) == [main, main_1, config, *library[::-1], package]


def test_a_merged_branch_counts_as_its_merge_commit_only(repo):
    """asv graphs main's first-parent history, so a branch's own commits are never selected."""
    package = repo.commit("package", PACKAGE)
    repo.git("checkout", "-q", "-b", "topic")
    topic = [repo.commit(f"topic {i}", {"kv_attention/t.py": str(i)}) for i in range(3)]
    repo.git("checkout", "-q", "main")
    docs = repo.commit("docs on main", {"README.md": "x"})
    repo.git("merge", "-q", "--no-ff", "-m", "merge topic", "topic")
    merge = repo.git("rev-parse", "HEAD")
    main = repo.commit("tests", {"tests/test_x.py": "# test"})
    selected = bench.select_commits(whole_history=False)
    assert selected == [main, merge, package] and not set(topic) & set(selected)
    assert bench.select_commits(whole_history=True) == [main, merge, docs, package]


def test_no_buildable_commit_is_a_clear_error(repo):
    repo.commit("readme", {"README.md": "x"})
    with pytest.raises(common.UserError, match="no commit of main has a buildable package"):
        bench.select_commits(whole_history=True)
