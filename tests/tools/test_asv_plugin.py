"""The asv plugin's pieces, without running asv (tests/tools/test_asv_commands.py runs the real commands)."""

import datetime
import json
import math
import re
import statistics
from types import SimpleNamespace

import pytest
from asv.config import Config
from asv.plugins.regressions import _GraphDataFilter
from asv.results import Results
from asv.runner import BenchmarkResult
from asv_runner.statistics import compute_stats

from tools import asv_plugin, common, dashboard, machine, results
from tools.commands import bisect
from tools.commands.gate import COUNT_FACTOR, CYCLES_FACTOR, DEFAULT_FACTOR, PEAKMEM_FACTOR, UNPAIRED_FACTOR, judge

TIME = {"name": "bench_x.Decode.time_decode", "type": "time", "params": [["16", "256"]], "param_names": ["T"],
        "version": "1"}
SAMPLES = [[1e-3 * (1 + 0.001 * i) for i in range(20)], [2e-3 * (1 + 0.001 * i) for i in range(20)]]


def measured(samples):
    """A BenchmarkResult as asv's runner returns it: the median is asv's to compute."""
    return BenchmarkResult([min(s) for s in samples], samples, [1] * len(samples), 0, "", None)


def stored(result):
    name = TIME["name"]
    return (result.get_result_value(name, TIME["params"]), result.get_result_samples(name, TIME["params"]))


def test_a_point_with_samples_is_kept_when_a_result_without_samples_replaces_it():
    result = Results({"machine": "m"}, {}, "a" * 40, 0, "3.11", "env", {})
    result.add_result(TIME, measured(SAMPLES), record_samples=True)
    before = stored(result)
    kept = asv_plugin._sampled_points(result, TIME)
    assert sorted(kept) == [0, 1]
    result.add_result(TIME, measured([[5e-3], [6e-3]]), record_samples=False)  # a --quick run: one sample each
    assert stored(result)[1] == [None, None]
    asv_plugin._restore(result, TIME["name"], kept)
    assert stored(result) == before and stored(result)[0][0] == pytest.approx(statistics.median(SAMPLES[0]))


def test_a_failure_or_a_new_version_is_never_hidden_by_a_kept_point():
    result = Results({"machine": "m"}, {}, "a" * 40, 0, "3.11", "env", {})
    result.add_result(TIME, measured(SAMPLES), record_samples=True)
    kept = asv_plugin._sampled_points(result, TIME)
    result.add_result(TIME, BenchmarkResult([None, 5e-3], [None, [5e-3]], [None, 1], 2, "boom", None))
    asv_plugin._restore(result, TIME["name"], kept)
    values, samples = stored(result)
    assert values[0] is None and values[1] == pytest.approx(statistics.median(SAMPLES[1])) and samples[1] == SAMPLES[1]
    assert asv_plugin._sampled_points(result, {**TIME, "version": "2"}) == {}


TRACK = {"name": "bench_x.Work.track_allocated_bytes", "type": "track", "params": [["16", "256"]],
         "param_names": ["T"], "version": "1"}
PEAKMEM = {"name": "bench_x.peakmem_decode", "type": "memory", "params": [], "param_names": [], "version": "1"}


def counted(values):
    """A BenchmarkResult of a track_ or peakmem_ benchmark: values, no samples."""
    return BenchmarkResult(values, [None] * len(values), [None] * len(values), 0, "", None)


def test_quick_never_replaces_a_stored_value_with_or_without_samples(monkeypatch):
    """Issue 20: asv run --quick replaced stored counts and peakmem (8,203,620 -> 8,198,249)."""
    monkeypatch.setattr(Results, "add_result", Results.add_result)  # put back after the test
    asv_plugin._keep_samples()  # what setup() installs: the wrapped Results.add_result
    result = Results({"machine": "m"}, {}, "a" * 40, 0, "3.11", "env", {})
    result.add_result(TRACK, counted([8_203_620, None]), started_at=datetime.datetime(2026, 12, 1, 14, 19,
                                                                                    tzinfo=datetime.timezone.utc))
    result.add_result(PEAKMEM, counted([50_000_000]))
    monkeypatch.setitem(asv_plugin._STATE, "quick", True)
    result.add_result(TIME, measured([[5e-3], [6e-3]]))  # a first --quick run: a timing without samples
    assert stored(result)[1] == [None, None]
    time_before = stored(result)
    started = dict(result._started_at)
    result.add_result(TRACK, counted([8_198_249, 4_000]))  # the quick run's values
    result.add_result(PEAKMEM, counted([51_000_000]))
    result.add_result(TIME, measured([[7e-3], [8e-3]]))
    assert result.get_result_value(TRACK["name"], TRACK["params"]) == [8_203_620, 4_000]  # a new point is added
    assert result.get_result_value(PEAKMEM["name"], []) == [50_000_000]
    assert stored(result) == time_before
    assert result._started_at[PEAKMEM["name"]] == started[PEAKMEM["name"]]  # measured when it was, not now
    assert result._started_at[TIME["name"]] == started[TIME["name"]]
    monkeypatch.setitem(asv_plugin._STATE, "quick", False)  # a full run measures again
    result.add_result(TRACK, counted([8_198_249, 4_000]))
    assert result.get_result_value(TRACK["name"], TRACK["params"]) == [8_198_249, 4_000]


def test_unsampled_names_the_timings_a_quick_run_stored():
    result = Results({"machine": "m"}, {}, "a" * 40, 0, "3.11", "env", {})
    result.add_result(TIME, measured(SAMPLES), record_samples=True)
    track = {"name": "bench_x.track_bytes", "type": "track", "params": [], "param_names": [], "version": "1"}
    result.add_result(track, BenchmarkResult([1000], [None], [None], 0, "", None))
    assert results.unsampled(result) == []
    result.add_result(TIME, measured([[5e-3], [6e-3]]), record_samples=False)
    assert results.unsampled(result) == [TIME["name"]]
    result.add_result(TIME, BenchmarkResult([None, math.nan], [None, None], [None, None], 2, "", None))
    assert results.unsampled(result) == []  # failed and skipped points have no samples to lose


def test_asv_find_sees_no_change_only_when_every_commit_it_measured_has_the_same_values():
    nan = math.nan
    assert asv_plugin._no_change({"a": [36_900_000], "b": [36_900_000], "c": [None]}) == (36_900_000,)
    assert asv_plugin._no_change({"a": [1, nan], "b": [1, nan]}) == (1, "n/a")
    assert asv_plugin._no_change({"a": [100], "b": [150]}) is None
    assert asv_plugin._no_change({"a": [1e-3], "b": [1.001e-3]}) is None  # a timing's medians differ
    assert asv_plugin._no_change({"a": [None]}) is None and asv_plugin._no_change({}) is None


@pytest.mark.parametrize("argv, given", [(["machine", "--yes"], False), (["machine", "--machine", "x"], True),
                                         (["machine", "--machine=x"], True), (["machine", "--mach", "x"], True),
                                         (["machine", "--ma=x"], True), (["machine", "--m"], True)])
def test_given_sees_the_option_and_its_abbreviations(argv, given):
    assert asv_plugin.given("--machine", argv) is given


def test_the_machine_name_is_the_hostname_and_a_fingerprint_of_cpu_and_machine_id(monkeypatch, tmp_path):
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("3d1219c7c4c5404aaa1f6d2a48adfda4\n")
    monkeypatch.setattr(machine, "MACHINE_ID_FILES", (str(tmp_path / "missing"), str(machine_id)))
    monkeypatch.setattr(machine.platform, "node", lambda: "vm")
    first = machine.default_name()
    assert re.fullmatch(r"vm-[0-9a-f]{8}", first) and machine.default_name() == first
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")  # another VM of the same image and CPU
    assert machine.default_name() != first
    monkeypatch.setattr(machine, "cpu_description", lambda: "another CPU")
    assert machine.default_name() not in (first,)
    monkeypatch.setattr(machine, "MACHINE_ID_FILES", ())
    assert machine.machine_id().startswith("mac-")


@pytest.mark.parametrize("name", ["../../docs/results/vm", "a/b", "", ".hidden", "..", "x" * 101, "a\nb"])
def test_a_machine_name_that_is_not_one_plain_folder_name_is_refused_before_asv_writes(name, tmp_path):
    from asv.machine import Machine
    from asv.util import UserError

    asv_plugin.setup()  # idempotent; wraps Machine.save
    with pytest.raises(ValueError, match="machine name must be"):
        machine.check_name(name)
    with pytest.raises(UserError, match="machine name must be"):
        Machine.save(SimpleNamespace(machine=name), str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    assert machine.check_name("vm-3fa1c2d9") == "vm-3fa1c2d9"


CACHE = {"params": [["16", "32", "64", "128", "256"], ["'no_cache'", "'concat'", "'preallocated'"]],
         "param_names": ["T", "strategy"]}


def test_a_graph_opens_on_every_strategy_at_the_largest_t_on_a_log_axis():
    query = dashboard.default_view(CACHE)
    assert query.split("&") == ["x-axis-scale=date", "y-axis-scale=log", "p-T=256", "p-strategy=%27no_cache%27",
                                "p-strategy=%27concat%27", "p-strategy=%27preallocated%27"]
    heads = {"params": [["'mha'", "'gqa'"], ["64", "1024"], ["'repeat_kv'", "'grouped'"]],
             "param_names": ["kind", "T", "path"]}
    assert dashboard.default_view(heads).count("p-kind") == 2 and "p-T=1024&" in dashboard.default_view(heads)
    assert dashboard.default_view({"params": [["1", "2"]], "param_names": ["B"]}) == "x-axis-scale=date"
    assert dashboard.default_view({}) == "x-axis-scale=date"


def test_default_views_are_written_once_and_cannot_end_the_script(tmp_path):
    index = {"benchmarks": {"bench_cache.CacheStrategy.time_decode": CACHE, "</script><b>": {}}}
    (tmp_path / "index.json").write_text(json.dumps(index))
    (tmp_path / "index.html").write_text("<html><head><title>asv</title></head></html>")
    assert dashboard.add_default_views(tmp_path) == 2
    assert dashboard.add_default_views(tmp_path) == 2
    html = (tmp_path / "index.html").read_text()
    assert html.count(f'<script src="{dashboard.VIEWS_SCRIPT}"></script>') == 1
    script = (tmp_path / dashboard.VIEWS_SCRIPT).read_text()
    assert "</script>" not in script and "\\u003c/script>" in script
    start = script.index("var views = ") + len("var views = ")
    views = json.loads(script[start:script.index("};") + 1])
    assert views["bench_cache.CacheStrategy.time_decode"] == dashboard.default_view(CACHE)


# --- one notion of regression -------------------------------------------------------------------


def dashboard_threshold(name):
    """The threshold asv's regressions page applies to ``name`` (asv's own lookup, on the branch main)."""
    conf = Config.load(str(common.ROOT / "asv.conf.json"))
    return _GraphDataFilter._get_threshold(SimpleNamespace(conf=conf), SimpleNamespace(params={"branch": "main"}),
                                      {}, name)


# A benchmark of each kind the suite has, and the factor the gate applies to it when it judges asv's unpaired
# samples, as the dashboard does (its regressions page shows asv's medians; the gate's default pairs timings).
KINDS = {
    "bench_cache.CacheStrategy.time_decode(256, 'concat')": UNPAIRED_FACTOR,
    "bench_batch.BatchSize.time_batched_decode(8)": UNPAIRED_FACTOR,
    "bench_cache.CacheStrategy.peakmem_decode(256, 'concat')": PEAKMEM_FACTOR,
    "bench_environment.peakmem_reference": PEAKMEM_FACTOR,
    "bench_work.CacheWork.track_allocated_bytes(256, 'concat')": UNPAIRED_FACTOR,
    "bench_cache.CacheStrategy.track_kv_cache_bytes(256, 'concat')": UNPAIRED_FACTOR,
    # issue 11's instruction counts and estimated cycles: the gate's count factor
    "bench_cache.CacheCounts.track_instructions(64, 'concat')": COUNT_FACTOR,
    "bench_cache.CacheCounts.track_estimated_cycles(64, 'concat')": CYCLES_FACTOR,
}


def rows(name, value, samples):
    stats = compute_stats(samples, 1)[1] if samples else None
    return [(name, [], [value], [stats], [samples], "1", "m", "env")]


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_dashboard_flags_a_step_where_the_gate_does(name):
    threshold = dashboard_threshold(name)
    assert 1 + threshold == pytest.approx(KINDS[name])
    sampled = name.split("(")[0].rsplit(".", 1)[-1].startswith("time_")
    base = [1.0 + 0.0001 * i for i in range(30)] if sampled else None
    for above, flagged in ((1.02, True), (0.98, False)):
        ratio = (1 + threshold) * above
        head = [ratio * x for x in base] if sampled else None
        regressions, _ = judge(rows(name, 1.0, base), rows(name, ratio * (1.0 if not base else base[15]), head),
                               UNPAIRED_FACTOR)
        assert bool(regressions) is flagged, (name, ratio)


def test_every_benchmark_of_the_suite_has_a_dashboard_threshold():
    from asv_runner.discovery import disc_benchmarks

    conf = Config.load(str(common.ROOT / "asv.conf.json"))
    names = [b.name for b in disc_benchmarks(str(common.ROOT / "benchmarks"))]
    unmatched = [n for n in names if not any(re.match(r, n + "@main") for r in conf.regressions_thresholds)]
    assert names and unmatched == []


# --- bisect ---------------------------------------------------------------------------------------


class FakePoint:
    """Values per commit index: worse than GOOD when above 1.1 times it; None cannot be judged."""

    def __init__(self, values):
        self.values, self.asked = values, []

    def measure(self, commits):
        self.asked += commits

    def worse(self, good, commit):
        value = self.values[commit]
        return None if value is None else value > 1.1 * self.values[good]

    def ratio(self, base, head):
        return "r"


@pytest.mark.parametrize("change", range(1, 9))
def test_bisect_finds_the_first_bad_commit_in_log2_steps(change, monkeypatch, capsys):
    monkeypatch.setattr(bisect, "describe", str)
    values = [100] * change + [150] * (9 - change)
    point = FakePoint(values)
    assert bisect.search(list(range(9)), point)[:2] == (change - 1, change)
    assert len(point.asked) <= 3


def test_bisect_steps_over_commits_it_cannot_judge(monkeypatch, capsys):
    monkeypatch.setattr(bisect, "describe", str)
    values = [100, 100, None, None, 150, 150]
    assert bisect.search(list(range(6)), FakePoint(values))[:2] == (1, 4)  # 2 and 3 are unknown
    assert "cannot be judged, skipped" in capsys.readouterr().out
    assert bisect.search(list(range(5)), FakePoint([100, 100, 100, None, 150]))[:2] == (2, 4)


def test_bisect_refuses_a_good_commit_off_the_first_parent_history(repo):
    from .conftest import PACKAGE

    base = repo.commit("package", PACKAGE)
    repo.git("checkout", "-q", "-b", "topic")
    topic = repo.commit("topic", {"kv_attention/t.py": "1"})
    repo.git("checkout", "-q", "main")
    repo.commit("main", {"README.md": "x"})
    repo.git("merge", "-q", "--no-ff", "-m", "merge", "topic")
    merge = repo.git("rev-parse", "HEAD")
    assert bisect.history(base, merge)[0] == base and len(bisect.history(base, merge)) == 3
    with pytest.raises(common.UserError, match="not on BAD"):
        bisect.history(topic, merge)
    with pytest.raises(common.UserError, match="not a later commit"):
        bisect.history(merge, base)


def test_bisect_judges_a_timing_in_pairs_and_a_count_by_its_values(monkeypatch):
    """A timing whose stored medians say 1.5x: in pairs it is 1.01x, so not worse; a paired run that
    failed cannot be judged; a count is judged on its values alone, never paired."""
    from tools import pairs

    timing = "bench_cache.CacheStrategy.time_decode(256, 'concat')"
    samples = [1.0 + 0.0001 * i for i in range(30)]
    rows = {"good": [(timing, [], [1.0], [compute_stats(samples, 1)[1]], [samples], "1", "m", "env")],
            "bad": [(timing, [], [1.5], [compute_stats([1.5 * x for x in samples], 1)[1]],
                     [[1.5 * x for x in samples]], "1", "m", "env")]}
    point = bisect.Point("time_decode", DEFAULT_FACTOR)
    point.rows, point.label = rows, timing
    point.pairs[("good", "bad")] = pairs.Paired(1.01, 0.99, 1.02, 20)
    assert point.worse("good", "bad") is False and point.ratio("good", "bad").startswith("1.0100x")
    point.pairs[("good", "bad")] = pairs.Paired(1.05, 1.04, 1.06, 20)
    assert point.worse("good", "bad") is True
    point.pairs[("good", "bad")] = {"failed": "AssertionError: wrong", "role": "head"}
    assert point.worse("good", "bad") is None
    unpaired = bisect.Point("time_decode", UNPAIRED_FACTOR, unpaired=True)
    unpaired.rows, unpaired.label = rows, timing
    assert unpaired.worse("good", "bad") is True and unpaired.ratio("good", "bad") == "1.500x"
