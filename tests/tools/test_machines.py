"""Two machines, one dashboard: ``publish --with`` (tools/combined.py) and ``report tables --machine A --machine B``.

The result files are written by hand in asv 0.6's layout (tests/tools/test_report.py's
``write_run``); the dashboard is written by the real ``asv publish``; every expected
figure is computed here from the medians the test chose.
"""

import hashlib
import json
import math
import os
import shutil
import stat
from pathlib import Path

import pytest

from tools import common, dev
from tools.report.tables import ACROSS_MACHINES

from .conftest import PACKAGE
from .test_report import BATCH, CACHE, COLUMNS, ENV, LENGTHS, RAGGED, SWEEP, medians, table_rows, write_run

CACHE_TITLE = "Cache experiment: full decode of one sequence"
BATCH_TITLE = "Batch experiment: B = 2 sequences, sequential vs batched"
STRATEGIES = ["no_cache", "concat", "preallocated"]
SUITE = {  # asv's benchmarks.json entries of the benchmarks write_run stores (its version is "v1")
    CACHE: {"params": [[str(t) for t in LENGTHS], [repr(s) for s in STRATEGIES]], "param_names": ["T", "strategy"]},
    BATCH: {"params": [[str(t) for t in LENGTHS], ["'sequential'", "'batched'"]], "param_names": ["T", "strategy"]},
    SWEEP: {"params": [["1", "2", "4", "8"]], "param_names": ["B"]},
}


@pytest.fixture(autouse=True)
def inside_venv(monkeypatch):
    """The commands run in-process, as inside .venv."""
    monkeypatch.setenv(common.INSIDE_VENV, "1")


def write_suite(results_dir):
    """benchmarks.json as asv writes it, for the benchmarks of ``write_run``."""
    entries = {name: {"name": name, "type": "time", "unit": "seconds", "version": "v1", **entry}
               for name, entry in SUITE.items()}
    (Path(results_dir) / "benchmarks.json").write_text(json.dumps({**entries, "version": 2}))


@pytest.fixture
def two(repo):
    """A project (commits c0, c1, c2; asv.conf.json without plugins) whose .asv/results holds machine
    ``box-a`` (c1, c2) and a directory ``stored/`` holding machine ``box-b`` (c0, c2, every time 2x)."""
    hashes = [repo.commit(f"c{i}", PACKAGE if i == 0 else {}) for i in range(3)]
    (repo.root / "asv.conf.json").write_text(json.dumps({
        "version": 1, "project": "p", "repo": ".", "branches": ["main"], "dvcs": "git",
        "results_dir": ".asv/results", "html_dir": ".asv/html"}))
    here, stored = repo.root / ".asv" / "results", repo.root / "stored"
    for i in (1, 2):
        write_run(here, hashes[i], machine="box-a", date=1000 * (i + 1))
    for i in (0, 2):
        write_run(stored, hashes[i], machine="box-b", date=1000 * (i + 1), scale=2.0)
    write_suite(here)
    write_suite(stored)
    repo.hashes, repo.here, repo.stored = hashes, here, stored
    return repo


def snapshot(*folders):
    """``{path: sha256}`` of every file under ``folders``."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def graph(html, machine, benchmark):
    """The graph asv wrote for ``benchmark`` on ``machine``: ``{commit: [values]}``."""
    index = json.loads((html / "index.json").read_text())
    found = [p for p in html.glob(f"graphs/**/machine-{machine}/**/{benchmark}.json")]
    assert len(found) == 1, found
    return {index["revision_to_hash"][str(rev)]: values for rev, values in json.loads(found[0].read_text())}


# --- publish --with ---------------------------------------------------------------------------------


def test_publish_with_puts_both_machines_in_one_dashboard_each_with_its_own_results(two, capsys):
    before = snapshot(two.here, two.stored)
    assert dev.main(["publish", "--with", str(two.stored)]) == 0
    out = capsys.readouterr().out
    html = two.root / ".asv" / "html"
    index = json.loads((html / "index.json").read_text())
    assert sorted(index["machines"]) == ["box-a", "box-b"] == index["params"]["machine"]
    for folder in (two.here / "box-a", two.stored / "box-b"):  # each machine's own machine.json, unchanged
        assert index["machines"][folder.name] == json.loads((folder / "machine.json").read_text())
    cache, _, sweep = medians()
    order = [(t, s) for t in LENGTHS for s in STRATEGIES]
    a, b = graph(html, "box-a", CACHE), graph(html, "box-b", CACHE)
    assert set(a) == {two.hashes[1], two.hashes[2]} and set(b) == {two.hashes[0], two.hashes[2]}
    assert a[two.hashes[2]] == pytest.approx([cache[k] for k in order])
    assert b[two.hashes[2]] == pytest.approx([2.0 * cache[k] for k in order])  # box-b's own figures
    assert graph(html, "box-b", SWEEP)[two.hashes[0]] == pytest.approx([2.0 * sweep[n] for n in (1, 2, 4, 8)])
    assert "box-a: 2 result files from .asv/results, 3 benchmarks graphed" in out
    assert "box-b: 2 result files from stored, 3 benchmarks graphed" in out
    assert snapshot(two.here, two.stored) == before  # nothing read was written, nothing added


def test_publish_with_refuses_a_machine_found_in_both_directories(two, capsys):
    write_run(two.stored, two.hashes[1], machine="box-a")
    assert dev.main(["publish", "--with", str(two.stored)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tools/dev.py publish: error: machine 'box-a' has results in both") and "\n" not in err
    assert not (two.root / ".asv" / "html").exists()


def test_a_machine_json_naming_another_machine_is_the_same_machine(two, capsys):
    """asv names a machine by machine.json's ``machine``: a folder of another name holding it is refused too."""
    folder = two.stored / "copied"
    folder.mkdir()
    (folder / "machine.json").write_text(json.dumps({"machine": "box-a", "version": 1}))
    assert dev.main(["publish", "--with", str(two.stored)]) == 1
    assert "machine 'box-a' has results in both" in capsys.readouterr().err


def test_a_copy_of_a_machines_folder_under_another_name_in_the_same_directory_is_refused(two, capsys):
    """asv names a machine by machine.json's ``machine``: a hand-renamed copy beside the folder would be merged."""
    shutil.copytree(two.stored / "box-b", two.stored / "box-b-copy")
    assert dev.main(["publish", "--with", str(two.stored)]) == 1
    err = capsys.readouterr().err.strip()
    assert f"machine 'box-b' has results in both {two.stored / 'box-b'} and {two.stored / 'box-b-copy'}" in err
    assert "\n" not in err and not (two.root / ".asv" / "html").exists()


@pytest.mark.parametrize("make, message", [
    (lambda root: root / "missing", "no such directory"),
    (lambda root: (root / "file").write_text("x") and root / "file", "it is a regular file, not a directory"),
    (lambda root: (root / "empty").mkdir() or root / "empty", "holds no machine's results"),
    (lambda root: root / ".asv" / "results", "the same directory as"),
    (lambda root: "", "the path is empty"),
])
def test_publish_with_a_directory_it_cannot_use_is_a_one_line_error_naming_it(two, capsys, make, message):
    path = make(two.root)
    assert dev.main(["publish", "--with", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tools/dev.py publish: error: --with{path and ' '}{path}") and message in err
    assert "\n" not in err


def test_publish_with_never_opens_a_fifo_among_the_results(two, capsys):
    os.mkfifo(two.stored / "box-b" / "00000000-fifo.json")
    assert dev.main(["publish", "--with", str(two.stored)]) == 0  # a FIFO opened for reading would block
    out = capsys.readouterr().out
    assert "skipped" in out and "00000000-fifo.json: a FIFO, not a regular file" in out
    assert stat.S_ISFIFO(os.lstat(two.stored / "box-b" / "00000000-fifo.json").st_mode)  # left as it was


def unreadable(monkeypatch, path):
    """``path`` unreadable (mode 000); as root, who reads it anyway, opening it fails as it would for anyone else."""
    path.chmod(0)
    if os.geteuid() == 0:
        real_open = os.open

        def refuse(name, *args, **kwargs):
            if os.path.abspath(name) == str(path):
                raise PermissionError(13, "Permission denied", str(name))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)


def test_publish_with_names_each_result_file_asv_cannot_read_and_publishes_the_rest(two, capsys, monkeypatch):
    box = two.stored / "box-b"
    (box / "0000000a-broken.json").write_text('{"commit_hash": ')
    locked = box / "0000000b-locked.json"
    shutil.copy(box / f"{two.hashes[0][:8]}-{ENV}.json", locked)
    unreadable(monkeypatch, locked)
    (box / "0000000c-folder.json").mkdir()
    (box / "0000000d-dangling.json").symlink_to(box / "gone.json")
    other = write_run(two.stored, two.hashes[1], machine="box-b", env="other-env")
    data = json.loads(other.read_text())
    data["params"]["machine"] = "box-c"  # a result file of another machine, copied into box-b's folder
    other.write_text(json.dumps(data))
    kept = sorted((p.name, stat.S_IFMT(os.lstat(p).st_mode)) for p in box.iterdir())
    assert dev.main(["publish", "--with", str(two.stored)]) == 0
    out = capsys.readouterr().out
    for name, why in [("0000000a-broken.json", "Error parsing JSON in file 'it'"),
                      ("0000000b-locked.json", "cannot be read (Permission denied)"),
                      ("0000000c-folder.json", "a directory, not a regular file"),
                      ("0000000d-dangling.json", "a dangling symlink, not a regular file"),
                      (other.name, "Error loading results file 'it': machine name is not 'box-b'")]:
        [line] = [line for line in out.splitlines() if line.startswith(f"note: skipped {box / name}: ")]
        assert why in line
    assert "box-b: 2 result files from stored (5 left out: asv cannot read them, see the notes), " in out
    html = two.root / ".asv" / "html"
    assert set(graph(html, "box-b", CACHE)) == {two.hashes[0], two.hashes[2]}  # the rest is published
    assert sorted(json.loads((html / "index.json").read_text())["machines"]) == ["box-a", "box-b"]
    assert sorted((p.name, stat.S_IFMT(os.lstat(p).st_mode)) for p in box.iterdir()) == kept  # left as it was


# --- report tables --machine A --machine B ----------------------------------------------------------


def tables(repo, *argv, capsys):
    code = dev.main(["report", "tables", *argv, "--config", str(repo.root / "asv.conf.json")])
    out, err = capsys.readouterr()
    return code, out, err


def rows_by_figure(out, title):
    """``{(key, figure): [across machines, A, B, B / A]}`` of a side-by-side table."""
    return {(int(r[0]), r[1]): r[2:] for r in table_rows(out, title)}


def test_tables_of_two_machines_put_the_same_commits_figures_side_by_side(two, capsys):
    nocache16 = medians()[0][(16, "no_cache")]
    write_run(two.stored, two.hashes[2], machine="box-b", date=3000, scale=2.0,
              override={(CACHE, (16, "no_cache")): 2.0 * 3 * nocache16})  # box-b: no_cache at T = 16 3x more
    code, out, err = tables(two, "--with", str(two.stored), "--machine", "box-a", "--machine", "box-b",
                            capsys=capsys)
    assert code == 0, err
    assert out.startswith(f"## kv-attention decode benchmarks at `{two.hashes[2][:8]}` on 2 machines: "
                          "`box-a`, `box-b`")  # the newest commit both measured
    assert "`box-a`:\n- commit" in out and "`box-b`:\n- commit" in out
    assert "NOT comparable across machines" in out
    cache, batch, _ = medians()
    rows = rows_by_figure(out, CACHE_TITLE)
    assert len(rows) == len(LENGTHS) * 5  # the check, two paired ratios and the lab's two
    for t in LENGTHS:
        assert rows[(t, "equal to full attention")][:3] == ["exact", "yes, all 3", "yes, all 3"]
        ratio = cache[(t, "no_cache")] / cache[(t, "preallocated")]
        b_ratio = ratio * (3 if t == 16 else 1)
        # hand-written results without the paired ratios: the ratio of asv's medians, marked
        assert rows[(t, "no_cache / preallocated")] == ["comparable", f"{ratio:.2f}x (unpaired)",
                                                        f"{b_ratio:.2f}x (unpaired)", f"{b_ratio / ratio:.3f}x"]
    assert rows[(16, "no_cache / preallocated")][3] == "3.000x" and rows[(32, "concat / preallocated")][3] == "1.000x"
    batch_rows = rows_by_figure(out, BATCH_TITLE)
    for t in LENGTHS:
        assert batch_rows[(t, "speedup")] == ["comparable", "1.500x (unpaired)", "1.500x (unpaired)", "1.000x"]


def test_tables_of_two_machines_read_from_one_results_directory_and_mark_counts_same_work(two, capsys):
    path = write_run(two.here, two.hashes[2], machine="box-c", extra=True)
    data = json.loads(path.read_text())
    data["results"][RAGGED][0] = [1.5 * v for v in data["results"][RAGGED][0]]  # box-c's ragged times 1.5x
    path.write_text(json.dumps(data))
    write_run(two.here, two.hashes[2], machine="box-a", extra=True)
    code, out, err = tables(two, "--machine", "box-a", "--machine", "box-c", "--commit", "HEAD",
                            "--experiment", "ragged", capsys=capsys)
    assert code == 0, err
    ragged = {(r[0], r[1]): r[2:] for r in table_rows(out, "Ragged experiment")}
    assert ragged[("equal", "rows, padded")] == ["exact", "2,048", "2,048", "1.000x"]
    assert ragged[("skewed", "padded / ms")][0] == "machine-bound" and ragged[("skewed", "padded / ms")][3] == "1.500x"
    assert ragged[("skewed", "padded / paged")][0] == "comparable"
    assert ragged[("skewed", "padded / paged")][3] == "1.000x"
    assert set(ACROSS_MACHINES.values()) == {"comparable", "exact", "machine-bound"}


def test_tables_of_two_machines_without_a_commit_in_common_is_a_one_line_error(two, capsys):
    (two.stored / "box-b" / f"{two.hashes[2][:8]}-{'virtualenv-py3.11-numpy2.2.6-OPENBLAS_NUM_THREADS1'}.json").unlink()
    code, _, err = tables(two, "--with", str(two.stored), "--machine", "box-a", "--machine", "box-b", capsys=capsys)
    assert code == 1 and "\n" not in err.strip()
    assert "no commit has results on every machine given (box-a, box-b;" in err
    assert f"box-a {two.hashes[2][:8]}" in err and f"box-b {two.hashes[0][:8]}" in err


def test_tables_of_two_machines_at_a_commit_one_lacks_names_that_machine(two, capsys):
    code, _, err = tables(two, "--with", str(two.stored), "--machine", "box-a", "--machine", "box-b",
                          "--commit", "HEAD~2", capsys=capsys)
    assert code == 1 and f"commit {two.hashes[0][:8]} (HEAD~2) has no results on machine 'box-a'" in err


@pytest.mark.parametrize("argv, message", [
    (["tables", "--machine", "box-a", "--machine", "box-a"], "--machine box-a is given twice"),
    (["compare", "HEAD~1", "HEAD", "--machine", "box-a", "--machine", "box-b"],
     "--machine is given 2 times: compare reads one machine; only tables puts several side by side"),
    (["tables", "--machine", "box-a", "--machine", "box-b"], "no results for machine 'box-b'"),
])
def test_machine_options_the_report_cannot_follow_are_one_line_errors(two, capsys, argv, message):
    code = dev.main(["report", *argv, "--config", str(two.root / "asv.conf.json")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and message in err and "\n" not in err and err.startswith("tools/dev.py report: error:")


def test_report_with_a_machine_in_both_directories_is_refused(two, capsys):
    write_run(two.stored, two.hashes[1], machine="box-a")
    code, _, err = tables(two, "--with", str(two.stored), "--machine", "box-a", capsys=capsys)
    assert code == 1 and "machine 'box-a' has results in both" in err


def test_a_quick_runs_unbounded_interval_is_read_and_other_infinities_are_not(two, capsys):
    """asv stores a point of one sample (--quick) with 99 % bounds -inf and inf."""
    path = write_run(two.here, two.hashes[2], machine="box-a", n_samples=1)
    data = json.loads(path.read_text())
    row = data["results"][CACHE]
    n = len(row[0])
    row[COLUMNS.index("stats_ci_99_a")], row[COLUMNS.index("stats_ci_99_b")] = [-math.inf] * n, [math.inf] * n
    path.write_text(json.dumps(data))
    code, out, err = tables(two, "--machine", "box-a", "--experiment", "cache", capsys=capsys)
    assert code == 0, err
    ratio = medians()[0][(16, "no_cache")] / medians()[0][(16, "preallocated")]
    assert table_rows(out, CACHE_TITLE)[0][1:3] == ["yes, all 3", f"{ratio:.2f}x (unpaired)"]
    row[COLUMNS.index("stats_q_25")] = [math.inf] * n
    path.write_text(json.dumps(data))
    code, _, err = tables(two, "--machine", "box-a", "--experiment", "cache", capsys=capsys)
    assert code == 1 and "malformed statistics" in err


def test_machine_given_twice_is_parsed_in_order_and_once_stays_one_name():
    args = dev.parse_args(["report", "tables", "--machine", "box-b", "--machine", "box-a"])
    assert (args.machine, args.machines) == ("box-b", ["box-b", "box-a"])
    args = dev.parse_args(["report", "csv", "--out", "-", "--machine", "box-a"])
    assert (args.machine, args.machines) == ("box-a", ["box-a"])


def test_the_browser_check_compares_the_machines_on_a_benchmark_both_have_graphs_of(tmp_path):
    from tools.commands import browser_check

    def graphs(machine, *names):
        folder = tmp_path / "graphs" / "arch-x86_64" / f"machine-{machine}" / "numpy-2.2.6"
        folder.mkdir(parents=True, exist_ok=True)
        for name in (*names, "summary"):
            (folder / f"{name}.json").write_text("[]")

    graphs("a", browser_check.REGRESSED, "bench_x.X.time_x")
    graphs("b", "bench_x.X.time_x")
    from tools.combined import graphed

    assert graphed(tmp_path) == {"a": {browser_check.REGRESSED, "bench_x.X.time_x"}, "b": {"bench_x.X.time_x"}}
    assert browser_check.compared_benchmark(tmp_path, ["a", "b"]) == "bench_x.X.time_x"
    graphs("b", browser_check.REGRESSED)
    assert browser_check.compared_benchmark(tmp_path, ["a", "b"]) == browser_check.REGRESSED
    with pytest.raises(browser_check.CheckFailed, match="no benchmark is graphed for every machine"):
        browser_check.compared_benchmark(tmp_path, ["a", "c"])
    graphs("my_laptop", "bench_x.X.time_x")  # asv's folder for a machine named "my:laptop" (sanitize_filename)
    from tools.combined import graphs_of

    assert graphs_of(graphed(tmp_path), "my:laptop") == {"bench_x.X.time_x"}
    assert browser_check.compared_benchmark(tmp_path, ["a", "my:laptop"]) == "bench_x.X.time_x"


def test_publish_with_a_directory_inside_the_dashboards_folder_is_refused_and_kept(two, capsys):
    inner = two.root / ".asv" / "html" / "inner"
    shutil.copytree(two.stored, inner)
    assert dev.main(["publish", "--with", str(inner)]) == 1  # asv publish empties .asv/html: it would be deleted
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tools/dev.py publish: error: --with {inner}: inside the dashboard's folder")
    assert (inner / "box-b" / "machine.json").is_file()
