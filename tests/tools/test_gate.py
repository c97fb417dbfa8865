"""The gate and the main job's verdict (tools/commands/gate.py, bench.py) on small asv result sets written here."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from asv.results import Results
from asv.runner import BenchmarkResult

from tools import common, dev, pairs, results
from tools.commands import bench
from tools.commands import gate as gate_command

from .conftest import PACKAGE

CONFIG = common.ROOT / "asv.conf.json"
MACHINE = "testbox"
TIME = "bench_x.Decode.time_decode"  # params T x strategy
TRACK = "bench_x.track_bytes"  # no params
COUNT = "bench_x.DecodeCounts.track_instructions"  # params T x strategy, one length
PARAMS = [["16", "256"], ["'concat'", "'preallocated'"]]
COUNT_PARAMS = [["64"], ["'concat'", "'preallocated'"]]
BENCHMARKS = {
    TIME: {"name": TIME, "type": "time", "unit": "seconds", "params": PARAMS, "param_names": ["T", "strategy"],
           "version": "v1"},
    TRACK: {"name": TRACK, "type": "track", "unit": "bytes", "params": [], "param_names": [], "version": "v1"},
    COUNT: {"name": COUNT, "type": "track", "unit": "instructions", "params": COUNT_PARAMS,
            "param_names": ["T", "strategy"], "version": "1"},
}
INSTRUCTIONS = 10_000_000
BASE_SAMPLES = [1e-3 * (1 + 0.002 * (i % 10)) for i in range(40)]  # 1.000 to 1.018 ms


@pytest.fixture
def project(repo, monkeypatch, tmp_path):
    """A git repository with base and head commits, the project's asv.conf.json and no results yet.

    ``project.write(commit, times, counts=..., track=...)`` stores asv results through asv's own
    Results API: ``times`` maps (T, strategy) to a factor on BASE_SAMPLES, None (failed) or "nan" (skipped).
    """
    shutil.copy(CONFIG, tmp_path / "asv.conf.json")
    base = repo.commit("base", PACKAGE)
    head = repo.commit("head: no code change", {})
    monkeypatch.chdir(tmp_path)
    calls, flagged = [], []
    monkeypatch.setattr(common, "record_machine", lambda name=None: MACHINE)
    monkeypatch.setattr(common, "asv_run", lambda commits, machine, *options, **kw: calls.append((commits, options)))
    monkeypatch.setattr(gate_command, "asv_compare", lambda base, head, machine, factor=None: list(flagged))
    results_dir = results.results_dir()
    env_name = pairs.environments()[0].name  # asv compare reads the configured environments' results only
    monkeypatch.setattr(pairs, "environments", lambda: [None])
    monkeypatch.setattr(pairs, "measure_confirmed", paired_as_stored)
    (results_dir / MACHINE).mkdir(parents=True)
    (results_dir / MACHINE / "machine.json").write_text(json.dumps({"machine": MACHINE, "version": 1}))
    (results_dir / "benchmarks.json").write_text(json.dumps({**BENCHMARKS, "version": 2}))

    def write(commit, times=None, counts=None, track=1000.0, version="v1"):
        times, counts = times or {}, counts or {}
        result = Results({"machine": MACHINE}, {}, commit, 0, "3.11", env_name, {})
        points, samples = [], []
        for key in [(t, s) for t in PARAMS[0] for s in PARAMS[1]]:
            f = times.get(key, 1.0)
            points.append(None if f is None else float(f) if f == "nan" else f * BASE_SAMPLES[20])
            samples.append(None if f is None or f == "nan" else [f * v for v in BASE_SAMPLES])
        result.add_result({**BENCHMARKS[TIME], "version": version},
                          BenchmarkResult(points, samples, [1] * 4, 0, "", None), record_samples=True)
        if track is not None:
            result.add_result(BENCHMARKS[TRACK], BenchmarkResult([track], [None], [None], 0, "", None))
        instructions = [None if f is None else INSTRUCTIONS * f for f in (counts.get(s, 1.0) for s in COUNT_PARAMS[1])]
        result.add_result(BENCHMARKS[COUNT], BenchmarkResult(instructions, [None] * 2, [None] * 2, 0, "", None))
        result.save(str(results_dir))

    repo.base, repo.head, repo.calls, repo.flagged, repo.write = base, head, calls, flagged, write
    repo.results_dir = results_dir
    return repo


def paired_as_stored(env, base, head, points, factor):
    """Stand-in pairs: each point's ratio HEAD / BASE of the stored medians, as if every pair agreed."""
    stored = [results.stored(MACHINE, commit) for commit in (base, head)]
    ratios = {label: stored[1][label].value / stored[0][label].value for _, _, label in points}
    return {label: pairs.Paired(ratio, ratio, ratio, pairs.MIN_PAIRS) for label, ratio in ratios.items()}


def gate(project, capsys, *options):
    """``tools/dev.py gate BASE HEAD OPTIONS`` in-process: (code, stdout)."""
    code = gate_command.run(dev.parse_args(["gate", project.base, project.head, *options]))
    return code, capsys.readouterr().out


def regressions(out):
    return sorted(line for line in out.splitlines() if line.startswith("REGRESSION"))


def test_no_change_exits_0(project, capsys):
    project.write(project.base)
    project.write(project.head)
    code, out = gate(project, capsys)
    assert code == 0 and "gate: exit 0" in out and project.calls == [([project.base, project.head], ())]


def test_a_timing_slower_in_pairs_exits_1(project, capsys):
    project.write(project.base)
    project.write(project.head, {("256", "'concat'"): 1.2})
    code, out = gate(project, capsys)
    assert code == 1 and regressions(out) == [f"REGRESSION 1.20x  {TIME}(256, 'concat')  (time, paired)"]
    assert gate(project, capsys, "--factor", "1.25")[0] == 0


def test_a_count_rise_is_flagged_at_its_strategys_count_points_only(project, capsys):
    project.write(project.base)
    project.write(project.head, counts={"'concat'": 1.5})
    code, out = gate(project, capsys)
    assert code == 1 and regressions(out) == [f"REGRESSION 1.50x  {COUNT}(64, 'concat')  (work)"]
    project.write(project.head, counts={"'concat'": 1.004})  # within the count factor 1.005
    assert gate(project, capsys)[0] == 0
    project.write(project.head, counts={"'concat'": 1.006})
    assert gate(project, capsys)[0] == 1


def test_failed_points_exit_2_at_either_commit(project, capsys):
    project.write(project.base)
    project.write(project.head, {("16", "'concat'"): None})
    code, out = gate(project, capsys)
    assert code == 2 and f"FAILED at head {project.head[:8]}  {TIME}(16, 'concat')" in out
    project.write(project.base, counts={"'preallocated'": None})
    project.write(project.head)
    code, out = gate(project, capsys)
    assert code == 2 and f"FAILED at base {project.base[:8]}  {COUNT}(64, 'preallocated')" in out


def test_a_skipped_point_at_both_commits_is_not_a_failure(project, capsys):
    project.write(project.base, {("16", "'concat'"): "nan"})
    project.write(project.head, {("16", "'concat'"): "nan"})
    assert gate(project, capsys)[0] == 0


def test_a_commit_without_results_exits_2(project, capsys):
    project.write(project.base)
    code, out = gate(project, capsys)
    assert code == 2 and f"head {project.head[:8]} has no results" in out


PREALLOCATED = {(t, "'preallocated'"): "nan" for t in PARAMS[0]}  # the strategy raises NotImplementedError


def test_a_strategy_that_vanishes_fails_the_gate_and_the_main_job(project, capsys):
    project.write(project.base)
    project.write(project.head, PREALLOCATED)
    code, out = gate(project, capsys)
    failed = sorted(line for line in out.splitlines() if line.startswith("FAILED"))
    assert code == 2 and failed == [f"FAILED at head {project.head[:8]}  {TIME}({t}, 'preallocated')  "
                                    f"{gate_command.VANISHED}" for t in ("16", "256")]
    assert "RETIRED in benchmarks/common.py" in out
    base, head = (results.stored(MACHINE, c) for c in (project.base, project.head))
    assert bench.verdict(project.head, gate_command.failures(base, head)) == 2  # main~1 -> main
    assert capsys.readouterr().out.count(f"FAILED at main {project.head[:8]}  {TIME}") == 2


def test_a_removed_benchmark_fails_unless_retired(project, capsys, monkeypatch):
    import benchmarks.common

    project.write(project.base)
    project.write(project.head, track=None)
    code, out = gate(project, capsys)
    assert code == 2 and f"{TRACK}  (vanished" in out
    monkeypatch.setattr(benchmarks.common, "RETIRED", {TRACK: "replaced by track_bytes_v2"}, raising=False)
    assert gate(project, capsys)[0] == 0


def test_an_unreadable_result_file_is_a_one_line_error_naming_it(project, capsys):
    """asv itself stops on it, naming the file (a killed run's truncated JSON, a FIFO): so does the gate."""
    project.write(project.base)
    project.write(project.head)
    head_file = next((project.results_dir / MACHINE).glob(f"{project.head[:8]}-*.json"))
    head_file.write_bytes(head_file.read_bytes()[:200])
    assert dev.main(["gate", project.base, project.head]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tools/dev.py gate: error: cannot read asv result file {MACHINE}/{head_file.name}")
    head_file.unlink()
    os.mkfifo(head_file)
    assert dev.main(["gate", project.base, project.head]) == 2 and "is a FIFO" in capsys.readouterr().err


def test_paired_timings_decide_and_a_failed_pair_exits_2(project, capsys, monkeypatch):
    project.write(project.base)
    project.write(project.head, {("256", "'concat'"): 1.2})  # the runs' medians: drift; the pairs say 1.01x
    verdicts = {f"{TIME}(256, 'concat')": pairs.Paired(1.01, 0.99, 1.03, 20),
                f"{TIME}(16, 'preallocated')": pairs.Paired(1.05, 1.04, 1.06, 20),
                f"{TIME}(16, 'concat')": pairs.Paired(1.04, 0.99, 1.08, 20)}  # interval reaches below 1
    measured = []

    def measure_confirmed(env, base, head, points, factor):
        measured.extend(label for _, _, label in points)
        return verdicts

    monkeypatch.setattr(pairs, "measure_confirmed", measure_confirmed)
    code, out = gate(project, capsys)
    assert code == 1 and regressions(out) == [f"REGRESSION 1.05x  {TIME}(16, 'preallocated')  (time, paired)"]
    assert sorted(measured) == sorted(f"{TIME}({t}, {s})" for t in PARAMS[0] for s in PARAMS[1])  # the whole suite
    verdicts[f"{TIME}(256, 'concat')"] = {"failed": "AssertionError: off", "role": "head"}
    code, out = gate(project, capsys)
    assert code == 2 and "(paired run: AssertionError: off)" in out


def test_asv_compare_is_asvs_own_table_and_its_marked_rows_are_read_both_ways(project, capsys, monkeypatch):
    monkeypatch.undo()  # the real asv compare, on this project
    monkeypatch.setattr(common, "ROOT", project.root)
    monkeypatch.chdir(project.root)
    project.write(project.base)
    project.write(project.head, {("256", "'concat'"): 1.5, ("16", "'preallocated'"): 0.5})
    monkeypatch.setattr(common, "ASV", (sys.executable, "-m", "asv"))
    flagged = gate_command.asv_compare(project.base, project.head, MACHINE)
    out = capsys.readouterr().out
    assert sorted(flagged) == [("+", f"{TIME}(256, 'concat')"), ("-", f"{TIME}(16, 'preallocated')")], out
    assert "| +  " in out and "| -  " in out and "(16, 'concat')" not in out, out


def test_the_main_jobs_summary_names_both_commits_and_pairs_only_what_asv_flags(project, capsys, monkeypatch):
    project.write(project.base)
    project.write(project.head, {("256", "'concat'"): 1.3})
    project.flagged.extend([("+", f"{TIME}(256, 'concat')"), ("-", f"{TIME}(16, 'preallocated')")])
    paired = []
    monkeypatch.setattr(bench, "asv_compare", lambda base, head, machine, factor=None: list(project.flagged))
    monkeypatch.setattr(pairs, "measure_confirmed", lambda env, base, head, points, factor: (
        paired.extend(points) or {label: pairs.Paired(1.3, 1.2, 1.4, 20) for _, _, label in points}))
    monkeypatch.setattr(bench.publish, "regressions", lambda html_dir: [
        (f"{TIME}(256, 'concat')", None, project.head, 1.0, 1.3), (f"{TIME}(16, 'concat')", None, project.base, 1, 2)])
    failed = bench.summary(MACHINE, [project.head, project.base], project.head, [project.head])
    out = capsys.readouterr().out
    assert f"the dashboard's Regressions page: 1 row(s) blame {project.head[:8]}:\n      1.30x  {TIME}(256, 'concat')\n" in out
    assert paired == [(TIME, 2, f"{TIME}(256, 'concat')")] and failed == []
    assert f"main {project.head[:8]} 'head: no code change' against the older {project.base[:8]} 'base'" in out
    assert f"worse 1.30x  {TIME}(256, 'concat')" in out
    assert "asv compare marked 1 row(s) worse and 1 better; of the 1 timing(s) marked worse, 1 worse in pairs" in out
    assert f"it holds 1 older row(s): jumps asv found between older commits of the sample, blamed on 1 commit(s) or " \
           f"range(s) before {project.head[:8]} ({project.base[:8]})" in out


def test_sigterm_stops_the_command_and_every_process_it_started(tmp_path):
    """asv starts each benchmark in a process group of its own: a grandchild in its own group is stopped too."""
    pids = tmp_path / "pids"
    child = ("import os, subprocess, sys, time; "
             f"g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], preexec_fn=os.setpgrp); "
             f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}'); time.sleep(60)")
    parent = ("import signal, sys; from tools import common, dev; "
              "signal.signal(signal.SIGTERM, dev.stopped)\n"
              "try:\n    common.run(sys.executable, '-c', " + repr(child) + ")\n"
              "except common.Stopped as s:\n    sys.exit(128 + s.signum)")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=common.ROOT)
    for _ in range(200):
        if pids.exists() and pids.read_text():
            break
        subprocess.run(["sleep", "0.05"])
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    for pid in pids.read_text().split():
        stat_file = f"/proc/{pid}/stat"
        assert not os.path.exists(stat_file) or open(stat_file).read().rsplit(")", 1)[1].split()[0] == "Z"
