"""The main job (tools/commands/bench.py): which commits it benchmarks."""

import subprocess

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
    selected = bench.select_commits(8)
    assert selected == [main, main_1, library, build] and readme not in selected and not set(docs) & set(selected)


def test_every_commit_that_can_change_a_result_is_selected(repo):
    package = repo.commit("package", PACKAGE)
    library = [repo.commit(f"lib {i}", {"kv_attention/a.py": str(i)}) for i in range(12)]
    config = repo.commit("asv config", {"asv.conf.json": "{}"})
    repo.commit("benchmarks only", {"benchmarks/bench_x.py": "# x"})
    main_1 = repo.commit("docs", {"README.md": "x"})
    main = repo.commit("tests", {"tests/test_x.py": "# test"})
    assert bench.select_commits(20) == [main, main_1, config, *library[::-1], package]


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
    selected = bench.select_commits(8)
    assert selected == [main, merge, package] and not set(topic) & set(selected) and docs not in selected


def test_no_buildable_commit_is_a_clear_error(repo):
    repo.commit("readme", {"README.md": "x"})
    with pytest.raises(common.UserError, match="no commit of main has a buildable package"):
        bench.select_commits(8)


# --- the bounded sample of the default selection -----------------------------------------------


def library_history(repo, count):
    """A buildable package, then ``count`` library commits (a comment changed each): newest first."""
    package = repo.commit("package", PACKAGE)
    return [repo.commit(f"lib {i}", {"kv_attention/a.py": f"# {i}"}) for i in range(count)][::-1] + [package]


def test_the_sample_is_bounded_and_keeps_main_the_newest_and_the_first_commit(repo):
    history = library_history(repo, 60)  # 61 commits that can change a result
    sample = bench.select_commits(8)
    assert bench.NEWEST + 2 < len(sample) <= 8 and len(set(sample)) == len(sample)
    assert sample[:bench.NEWEST] == history[:bench.NEWEST]  # main, main~1 and the next newest, in order
    assert history[-1] in sample  # the first buildable commit: the spread reaches the whole history
    assert sample == [c for c in history if c in sample]  # newest first, as the history


def test_the_older_commits_are_spread_evenly_over_the_history(repo):
    history = library_history(repo, 60)
    older = history[bench.NEWEST:][::-1]  # oldest first
    sample = bench.select_commits(8)
    places = sorted(older.index(c) for c in sample[bench.NEWEST:])
    assert places == [0, 16, 32, 48]  # 57 older commits, 4 places left: every 16th from the oldest


def test_a_new_commit_adds_only_itself_to_the_sample(repo):
    """A re-run after one new library commit measures just that commit: the rest of the sample stays."""
    library_history(repo, 40)
    for i in range(30):
        before = set(bench.select_commits(8))
        new = repo.commit(f"new {i}", {"kv_attention/b.py": f"# {i}"})
        after = set(bench.select_commits(8))
        assert after - before <= {new}, i


def test_unbuildable_commits_are_never_sampled(repo):
    repo.commit("readme only", {"README.md": "x"})
    unbuildable = repo.commit("library before the package", {"kv_attention/a.py": "# early"})
    library_history(repo, 20)
    assert unbuildable not in bench.select_commits(20)
    assert unbuildable not in bench.select_commits(3)


def test_a_short_history_is_taken_whole(repo):
    history = library_history(repo, 5)
    assert bench.select_commits(8) == history
    assert bench.select_commits(2) == history[:2]


@pytest.mark.parametrize("options, bound", [([], bench.DEFAULT_COMMITS), (["--commits", "20"], 20)])
def test_the_command_line_sets_the_bound(options, bound):
    from tools import dev

    args = dev.parse_args(["bench", *options])
    assert args.commits == bound


@pytest.mark.parametrize("options", [["--commits", "1"], ["--commits", "x"], ["--commits", "2.5"]])
def test_a_bad_bound_is_refused(options, capsys):
    from tools import dev

    with pytest.raises(SystemExit) as stop:
        dev.parse_args(["bench", *options])
    assert stop.value.code == 2 and "--commits" in capsys.readouterr().err


def test_the_machine_is_recorded_as_asv_machine_detects_it_then_named(monkeypatch):
    """asv machine --yes --machine NAME alone stores the name only: the hostname's full entry is recorded first."""
    calls = []
    monkeypatch.setattr(common, "run", lambda *command, **kw: calls.append(command[3:]) or
                        subprocess.CompletedProcess(command, 0, "", ""))
    name = common.record_machine()
    assert calls == [("machine", "--yes"), ("machine", "--yes", "--machine", name)]


def test_main_is_timed_beside_main_1_when_main_is_new(repo):
    """main~1's timings are measured again in main's run (rounds interleaved), never another commit's."""
    package = repo.commit("package", PACKAGE)
    main_1 = repo.commit("library", {"kv_attention/a.py": "# 1"})
    main = repo.commit("docs", {"README.md": "x"})
    commits = bench.select_commits(8)
    assert commits == [main, main_1, package]
    assert bench.beside_parent(commits, todo=[main]) == [main_1, main]
    assert bench.beside_parent(commits, todo=[main_1, package]) == []  # main measured already: nothing again
    assert bench.beside_parent(commits[:1], todo=[main]) == []  # main~1 not in the sample


def test_a_commit_with_a_benchmark_stored_at_another_version_is_measured_again(monkeypatch):
    """asv ignores a result of another version (``Results.get_result_keys``), so a version bump re-measures the
    sample's commits; before the first run (no benchmarks.json) every commit is measured."""
    from tools import results

    point = {v: results.Point("bench_x.X.time_y", {}, 1.0, version=v) for v in "12"}
    stored = {"new": {"p": point["2"]}, "old": {"p": point["1"]}, "none": {}}
    monkeypatch.setattr(results, "stored", lambda machine, commit: stored[commit])
    assert bench.to_measure("box", list(stored), {"bench_x.X.time_y": {"version": "2"}}) == ["old", "none"]
    assert bench.to_measure("box", list(stored), {}) == list(stored)


def test_main_1_that_does_not_build_is_not_timed_again(repo):
    main_1 = repo.commit("readme only: no package yet", {"README.md": "x"})
    main = repo.commit("package", PACKAGE)
    commits = bench.select_commits(8)
    assert main_1 not in commits and bench.beside_parent(commits, todo=[main]) == []


def test_the_answers_of_the_newest_commit_with_the_same_package_and_suites_stand(repo):
    """A commit that changes neither the package nor a suite reuses the stored answers; any other measures them."""
    measured = repo.commit("package", PACKAGE)
    folder = repo.root / ".asv" / "answers" / "box"
    folder.mkdir(parents=True)
    (folder / f"{measured[:8]}-env.json").write_text("{}")
    readme = repo.commit("readme", {"README.md": "x"})
    assert bench.answers_source("box", readme) == measured and bench.answers_source("box", measured) == measured
    for change in ({"kv_attention/a.py": "# 1"}, {"answers/bench_x.py": "# 1"}, {"benchmarks/common.py": "# 1"}):
        repo.git("reset", "-q", "--hard", readme)
        assert bench.answers_source("box", repo.commit("change", change)) is None, change
    assert bench.answers_source("elsewhere", readme) is None  # none stored on this machine


def test_the_answers_are_printed_from_the_runs_the_readme_quotes():
    from tools import results
    from tools.report import tables

    quoted = bench.quoted_runs()
    assert quoted["cache"] == quoted["batch"] and quoted["model"]  # README's rendered and plotted commands
    run = results.ResultsDir(str(common.ROOT / "docs" / "results")).load(*quoted["cache"])
    figures = dict(bench.figures(run))
    concat = [run.value(tables.CACHE_PAIRED + end, T=t, strategy="concat") for t in (16, 256) for end in ("", "_low",
                                                                                                         "_high")]
    assert figures["2. concat / preallocated"] == "{:.2f}x [{:.2f}, {:.2f}] at T = 16 … {:.2f}x [{:.2f}, {:.2f}] at " \
        "T = 256".format(*concat)
    assert figures["1. equal to full attention"] == "5 of 5 lengths"
