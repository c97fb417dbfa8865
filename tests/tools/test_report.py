"""The report (tools/commands/report.py, tools/report/): tables, CSV and plots from asv result files the
tests write themselves.

The result files are written here by hand in asv 0.6's documented layout
(``<results>/<machine>/machine.json``, ``<hash8>-<env>.json`` with
``result_columns``), not with asv's writer, and every expected figure is
computed in the test from the medians the test chose.
"""

import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import common, dev

ROOT = common.ROOT
ENV = "virtualenv-py3.11-numpy2.2.6-OPENBLAS_NUM_THREADS1"
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
           "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
LENGTHS = [16, 32, 64, 128, 256]
CACHE = "bench_cache.CacheStrategy.time_decode"
BATCH = "bench_batch.BatchStrategy.time_decode"
SWEEP = "bench_batch.BatchSize.time_batched_decode"
HEADS = "bench_heads.HeadsDecode.time_decode"
HEADS_PEAK = "bench_heads.HeadsDecode.track_decode_peak_bytes"
HEADS_CACHE = "bench_heads.HeadsCacheBytes.track_kv_cache_bytes"
RAGGED = "bench_ragged.RaggedDecode.time_decode"
RAGGED_ROWS = "bench_ragged.RaggedDecode.track_row_steps"
RAGGED_SLOTS = "bench_ragged.RaggedDecode.track_reserved_slots"
PARAM_NAMES = {CACHE: ["T", "strategy"], BATCH: ["T", "strategy"], SWEEP: ["B"],
               "bench_environment.track_blas_threads": [],
               HEADS: ["kind", "T", "path"], HEADS_PEAK: ["kind", "T", "path"], HEADS_CACHE: ["kind", "T"],
               RAGGED: ["strategy", "lengths"], RAGGED_ROWS: ["strategy", "lengths"],
               RAGGED_SLOTS: ["strategy", "lengths"]}
CACHE_PAIRED = "bench_cache.CacheRatios.track_ratio"
BATCH_PAIRED = "bench_batch.BatchRatios.track_ratio"
SWEEP_PAIRED = "bench_batch.BatchSizeRatios.track_ratio"
HEADS_PAIRED = "bench_heads.HeadsRatios.track_ratio"
RAGGED_PAIRED = "bench_ragged.RaggedRatios.track_ratio"
BATCH_STEP = {side: f"bench_batch.BatchRatios.track_{side}_step" for side in ("sequential", "batched", "saved")}
PAIRED_NAMES = {CACHE_PAIRED: ["T", "strategy"], BATCH_PAIRED: ["T"], SWEEP_PAIRED: ["B"],
                HEADS_PAIRED: ["kind", "T"], RAGGED_PAIRED: ["strategy", "lengths"],
                **{name: ["T"] for name in BATCH_STEP.values()}}
PARAM_NAMES.update({name + end: names for name, names in PAIRED_NAMES.items() for end in ("", "_low", "_high")})
KINDS = {"mha": 8, "gqa": 2, "mqa": 1}
HEADS_T = [64, 256, 1024]
DISTRIBUTIONS = {"equal": [256] * 8, "uniform": [16, 50, 85, 119, 153, 187, 222, 256], "skewed": [256] + [16] * 7}


def medians(scale=1.0):
    """Chosen medians (seconds): easy to check by hand, distinct per cell."""
    cache = {(t, s): scale * t * f * 1e-5 for t in LENGTHS for s, f in
             (("no_cache", t / 8), ("concat", 1.5), ("preallocated", 1.25))}
    batch = {(t, s): scale * t * f * 1e-5 for t in LENGTHS for s, f in (("sequential", 3.0), ("batched", 2.0))}
    sweep = {b: scale * (1 + b) * 1e-3 for b in (1, 2, 4, 8)}
    return cache, batch, sweep


def _entry(params, values, n_samples):
    """One asv results row: values in itertools.product order; None = failed, NaN = skipped."""
    def stat(f):
        return [None if v is None or v != v else f(v) for v in values]

    sample_lists = [None if v is None or v != v or not n_samples else
                    [v * (1 + 0.01 * (i - n_samples // 2)) for i in range(n_samples)] for v in values]
    row = {"result": values, "params": params, "version": "v1", "started_at": 1, "duration": 1.0,
           "stats_ci_99_a": stat(lambda v: 0.9 * v), "stats_ci_99_b": stat(lambda v: 1.1 * v),
           "stats_q_25": stat(lambda v: 0.95 * v), "stats_q_75": stat(lambda v: 1.05 * v),
           "stats_number": stat(lambda v: 1), "stats_repeat": stat(lambda v: n_samples or 10),
           "samples": sample_lists if n_samples else None, "profile": None}
    return [row[c] for c in COLUMNS]


def heads_and_ragged(n_samples):
    """Result rows of the heads and ragged benchmarks, from figures chosen here (times in seconds)."""
    kinds, lengths = [repr(k) for k in KINDS], [str(t) for t in HEADS_T]
    paths, strategies = ["'repeat_kv'", "'grouped'"], ["'padded'", "'compacted'", "'paged'"]
    dists = [repr(d) for d in DISTRIBUTIONS]
    heads = [t * 1e-4 * (1.0 if p == "repeat_kv" else 1 / n) for k, n in KINDS.items() for t in HEADS_T
             for p in ("repeat_kv", "grouped")]
    peak = [(2 * 4 * n * t * 16 * 8) * (2 if p == "repeat_kv" else 1) for k, n in KINDS.items() for t in HEADS_T
            for p in ("repeat_kv", "grouped")]
    cache = [2 * 4 * n * t * 16 * 8 for n in KINDS.values() for t in HEADS_T]
    ragged = [{"padded": 0.016, "compacted": 0.002 * (i + 1), "paged": 0.003 * (i + 1)}[s]
              for s in ("padded", "compacted", "paged") for i, _ in enumerate(DISTRIBUTIONS)]
    rows = [8 * 256 if s == "padded" else sum(v) for s in ("padded", "compacted", "paged")
            for v in DISTRIBUTIONS.values()]
    slots = [8 * 256 if s != "paged" else 16 * math.ceil(max(v) / 16) * (1 + i)
             for s in ("padded", "compacted", "paged") for i, v in enumerate(DISTRIBUTIONS.values())]
    return {
        HEADS: _entry([kinds, lengths, paths], heads, n_samples),
        HEADS_PEAK: _entry([kinds, lengths, paths], peak, 0),
        HEADS_CACHE: _entry([kinds, lengths], cache, 0),
        RAGGED: _entry([strategies, dists], ragged, n_samples),
        RAGGED_ROWS: _entry([strategies, dists], rows, 0),
        RAGGED_SLOTS: _entry([strategies, dists], slots, 0),
    }


def paired_values():
    """Chosen paired ratios, benchmark -> {point: (median, low, high)}: none equal to a ratio of the medians,
    so a cell shows which one the table took."""
    return {
        CACHE_PAIRED: {(t, s): (r, 0.99 * r, 1.02 * r) for t in LENGTHS
                       for s, r in (("no_cache", t / 10), ("concat", 1.1 + t / 1000))},
        BATCH_PAIRED: {(t,): (1.8 - t / 1000, 1.79 - t / 1000, 1.81 - t / 1000) for t in LENGTHS},
        SWEEP_PAIRED: {(b,): (0.9 * b, 0.88 * b, 0.91 * b) for b in (2, 4, 8)},
        HEADS_PAIRED: {(k, 64): (1 + n / 10, 1 + n / 11, 1 + n / 9) for k, n in KINDS.items()},
        RAGGED_PAIRED: {(s, d): (f * (i + 2), f * (i + 2) - 0.01, f * (i + 2) + 0.02)
                        for s, f in (("padded", 1.25), ("compacted", 0.25)) for i, d in enumerate(DISTRIBUTIONS)},
        # seconds a step from the speedup's pairs (BatchRatios): only saved's interval is shown
        BATCH_STEP["sequential"]: {(t,): (30e-6 + t * 1e-8, 0.0, 0.0) for t in LENGTHS},
        BATCH_STEP["batched"]: {(t,): (18e-6 + t * 1e-8, 0.0, 0.0) for t in LENGTHS},
        BATCH_STEP["saved"]: {(t,): (12e-6, 11e-6, 13.5e-6) for t in LENGTHS},
    }


def paired_entries(override):
    """Result rows of the paired ratios and their intervals' ends (``override`` as :func:`write_run`'s)."""
    rows = {}
    for name, points in paired_values().items():
        keys = list(points)
        dimensions = [list(dict.fromkeys(key[i] for key in keys)) for i in range(len(keys[0]))]
        params = [[repr(v) for v in values] for values in dimensions]
        for j, end in enumerate(("", "_low", "_high")):
            values = [override.get((name + end, key), points[key][j]) for key in keys]
            rows[name + end] = _entry(params, values, 0)
    return rows


def write_run(results_dir, commit, *, machine="box", date=1_000, scale=1.0, n_samples=11, override=None,
              env=ENV, extra=False, paired=False):
    """Write one asv result file for ``commit`` (full hash) on ``machine``; returns its path.

    ``override`` maps (benchmark, param tuple) -> value (None = failed, NaN = skipped). ``extra`` adds the
    heads and ragged benchmarks, ``paired`` the paired ratios (:func:`paired_values`).
    """
    cache, batch, sweep = medians(scale)
    override = override or {}
    folder = Path(results_dir) / machine
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(json.dumps(
        {"machine": machine, "arch": "x86_64", "cpu": "Test CPU", "num_cpu": "2", "os": "Linux",
         "ram": str(8 * 2**30), "version": 1}))
    (Path(results_dir) / "benchmarks.json").write_text(json.dumps(
        {**{name: {"name": name, "param_names": names} for name, names in PARAM_NAMES.items()}, "version": 2}))

    def values(name, table, keys):
        return [override.get((name, k), table[k]) for k in keys]

    strategies = ["no_cache", "concat", "preallocated"]
    cache_keys = [(t, s) for t in LENGTHS for s in strategies]
    batch_keys = [(t, s) for t in LENGTHS for s in ("sequential", "batched")]
    t_params = [str(t) for t in LENGTHS]
    data = {
        "commit_hash": commit, "env_name": env, "date": date, "python": "3.11",
        "params": {"machine": machine, "arch": "x86_64", "cpu": "Test CPU", "num_cpu": "2", "os": "Linux",
                   "ram": str(8 * 2**30), "python": "3.11", "numpy": "2.2.6"},
        "requirements": {"numpy": "2.2.6"}, "env_vars": {"OPENBLAS_NUM_THREADS": "1"},
        "result_columns": COLUMNS, "durations": {}, "version": 2,
        "results": {
            CACHE: _entry([t_params, [repr(s) for s in strategies]], values(CACHE, cache, cache_keys), n_samples),
            BATCH: _entry([t_params, ["'sequential'", "'batched'"]], values(BATCH, batch, batch_keys), n_samples),
            SWEEP: _entry([["1", "2", "4", "8"]], values(SWEEP, sweep, [1, 2, 4, 8]), n_samples),
            "bench_environment.track_blas_threads": _entry([], [1], 0),
        },
    }
    if extra:
        data["results"].update(heads_and_ragged(n_samples))
    if paired:
        data["results"].update(paired_entries(override))
    path = folder / f"{commit[:8]}-{env}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with three commits, made the commands' ``common.ROOT``; returns (path, [hash of commit 0, 1,
    2])."""
    monkeypatch.setattr(common, "ROOT", tmp_path)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q", "-b", "main"], check=True)
    hashes = []
    for i in range(3):
        subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", f"c{i}"], check=True)
        hashes.append(subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True,
                                     text=True).stdout.strip())
    (tmp_path / "asv.conf.json").write_text(json.dumps({"version": 1, "results_dir": ".asv/results"}))
    return tmp_path, hashes


@pytest.fixture(autouse=True)
def inside_venv(monkeypatch):
    """The commands run in-process, as inside .venv."""
    monkeypatch.setenv(common.INSIDE_VENV, "1")


def report(repo_dir, *argv, capsys=None):
    """``tools/dev.py report ARGV`` in-process against ``repo_dir`` (``common.ROOT``): (exit code, stdout, stderr)."""
    assert common.ROOT == Path(repo_dir)
    code = dev.main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(text, title):
    """The body rows of the Markdown table under heading ``title``: lists of stripped cells."""
    block = text.split(f"### {title}", 1)[1].split("###", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


CACHE_TITLE = "Cache experiment: full decode of one sequence"
BATCH_TITLE = "Batch experiment: B = 2 sequences, sequential vs batched, in pairs"
SWEEP_TITLE = "Batch size: batched decode at T = 128"
HEADS_TITLE = "Heads experiment: MHA, GQA and MQA decode, repeat_kv vs grouped"
RAGGED_TITLE = "Ragged experiment: padded vs compacted (dynamic exit) vs paged KV cache"


# --- tables -----------------------------------------------------------------------------------------


def test_every_experiment_is_defined_once_with_its_table_and_the_suites_benchmark():
    from benchmarks.common import STRATEGIES
    from tools.commands import report as command
    from tools.report import EXPERIMENTS, samples, tables

    assert list(tables.TABLES) == list(EXPERIMENTS) and command.EXPERIMENTS is EXPERIMENTS
    assert EXPERIMENTS == {"cache": CACHE_PAIRED, "batch": BATCH_PAIRED, "batch_size": SWEEP, "heads": HEADS,
                           "ragged": RAGGED, "roofline": "bench_roofline.Roofline.track_ratio",  # no timing
                           "quantized": "bench_quantized.QuantizedDecode.time_decode",
                           "beyond": "bench_roofline.Roofline.track_ratio",  # one headline per experiment
                           "model": "bench_model.ModelStep.track_ratio",
                           "model_batch": "bench_model.ModelBatch.track_ratio",
                           "speculative": "bench_speculative.SpeculativeRatios.track_ratio"}
    assert [samples._experiment(timing) for timing in [CACHE, BATCH, SWEEP, HEADS, RAGGED]] == [
        "cache", "batch", "batch_size", "heads", "ragged"]
    assert samples._experiment("bench_split.SplitDecode.time_decode") == "split"
    assert set(STRATEGIES) == {"cache", "batch", "ragged"}  # heads has paths (common.HEADS_PATHS), not strategies


def test_tables_show_the_lab_figures_computed_from_the_medians(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2])
    code, out, err = report(path, "tables", "--commit", "HEAD", capsys=capsys)
    assert code == 0, err
    cache, batch, sweep = medians()
    published = {16: (1.51, 0.194 / 0.180), 256: (16.18, 3.083 / 2.509)}  # the lab's README, T = 16 and 256
    rows = table_rows(out, CACHE_TITLE)
    assert [int(r[0]) for r in rows] == LENGTHS
    for row, t in zip(rows, LENGTHS):
        assert row[1] == "yes, all 3"  # every strategy's point has a value: its check passed
        assert float(row[2].removesuffix("x (unpaired)")) == pytest.approx((t / 8) / 1.25, abs=5e-3)
        assert row[3] == f"{1.5 / 1.25:.2f}x (unpaired)"  # concat / preallocated, of the medians: no paired value
        if t in published:
            assert row[4:] == [f"{published[t][0]:.2f}x", f"{published[t][1]:.2f}x"]
    rows = {int(r[0]): r for r in table_rows(out, BATCH_TITLE)}
    assert list(rows) == [16, 32, 64, 128, 256, 1024, 2048]  # the lab's T and the paired experiment's
    for t, row in rows.items():
        assert row[1] == ("1.500x (unpaired)" if t <= 256 else "n/a")  # asv's medians where no pairs
        assert row[2] == {16: "1.687x", 32: "1.653x", 64: "1.611x", 128: "1.499x", 256: "1.346x"}.get(t, "n/a")
        assert row[3:] == ["n/a"] * 4  # per-step times only from pairs
    rows = table_rows(out, SWEEP_TITLE)
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8]
    for row, b in zip(rows, (1, 2, 4, 8)):
        assert float(row[1]) == pytest.approx(sweep[b] * 1e3, abs=5e-4)
        assert float(row[2]) == pytest.approx(sweep[b] / b * 1e3, abs=5e-4)
        assert int(row[3].replace(",", "")) == round(b * 128 / sweep[b])
        scaling = row[4].removesuffix(" (unpaired)") if b > 1 else row[4]  # B = 1 over itself: exactly 1
        assert float(scaling.rstrip("x")) == pytest.approx((b * 128 / sweep[b]) / (128 / sweep[1]), abs=5e-4)


def test_heads_and_ragged_tables(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], extra=True)
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0
    rows = table_rows(out, HEADS_TITLE)
    assert [(r[0], int(r[1])) for r in rows] == [(k, t) for k in KINDS for t in HEADS_T]
    for row in rows:
        n, t = KINDS[row[0]], int(row[1])
        assert float(row[2]) == pytest.approx(t * 0.1, abs=5e-4)  # repeat_kv ms
        assert float(row[3]) == pytest.approx(t * 0.1 / n, abs=5e-4)  # grouped ms
        assert row[4] == f"{n:.3f}x (unpaired)"  # repeat_kv / grouped
        cache_bytes = 2 * 4 * n * t * 16 * 8
        assert row[5:] == [f"{2 * cache_bytes / 2**20:,.2f} MiB", f"{cache_bytes / 2**20:,.2f} MiB",
                           f"{cache_bytes / 2**20:,.2f} MiB"]
    rows = table_rows(out, RAGGED_TITLE)
    assert [r[0] for r in rows] == list(DISTRIBUTIONS)
    for i, (row, lengths) in enumerate(zip(rows, DISTRIBUTIONS.values())):
        assert [float(c) for c in row[1:4]] == pytest.approx([16.0, 2.0 * (i + 1), 3.0 * (i + 1)])
        assert row[4] == f"{0.016 / (0.003 * (i + 1)):.2f}x (unpaired)" and row[5] == "0.67x (unpaired)"
        assert row[6:] == ["2,048", f"{sum(lengths):,}", "2,048", f"{16 * 16 * (1 + i):,}"]


def interval(median, low, high, digits):
    return f"{median:.{digits}f}x [{low:.{digits}f}, {high:.{digits}f}]"


def test_the_ratio_columns_are_the_paired_values_with_their_intervals(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], extra=True, paired=True)
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0
    paired, (cache, batch, sweep) = paired_values(), medians()
    for row, t in zip(table_rows(out, CACHE_TITLE), LENGTHS):
        assert row[2:4] == [interval(*paired[CACHE_PAIRED][(t, s)], 2) for s in ("no_cache", "concat")]
    for row, t in zip(table_rows(out, BATCH_TITLE), LENGTHS):
        seq, bat = 30 + t * 1e-2, 18 + t * 1e-2  # µs a step, from the pairs
        assert row[1] == interval(*paired[BATCH_PAIRED][(t,)], 3)
        assert row[3:] == [f"{seq:.1f}", f"{bat:.1f}", "12.0 [11.0, 13.5]", f"{2 / (bat * 1e-6):,.0f}"]
    rows = table_rows(out, SWEEP_TITLE)
    assert rows[0][4] == "1.000x" and [r[4] for r in rows[1:]] == [interval(*paired[SWEEP_PAIRED][(b,)], 3)
                                                                    for b in (2, 4, 8)]
    for row in table_rows(out, HEADS_TITLE):  # paired at T = 64 only: the medians' ratio, marked, elsewhere
        kind, t, n = row[0], int(row[1]), KINDS[row[0]]
        assert row[4] == (interval(*paired[HEADS_PAIRED][(kind, 64)], 3) if t == 64 else f"{n:.3f}x (unpaired)")
    for row in table_rows(out, RAGGED_TITLE):
        assert row[4:6] == [interval(*paired[RAGGED_PAIRED][(s, row[0])], 2) for s in ("padded", "compacted")]
    assert "95 % interval" in out and "A ratio marked (unpaired) is one of asv's medians" in out


def test_the_paired_ratios_are_read_from_the_answers_suites_results_beside(repo, capsys):
    """The answers suite stores its results in .asv/answers (common.answers_config): a run is both files."""
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], extra=True)
    answers = write_run(path / ".asv/answers", hashes[2], paired=True)
    data = json.loads(answers.read_text())
    data["results"] = {k: v for k, v in data["results"].items() if k in paired_entries({})}
    answers.write_text(json.dumps(data))
    code, out, _ = report(path, "tables", "--experiment", "cache", capsys=capsys)
    assert code == 0
    for row, t in zip(table_rows(out, CACHE_TITLE), LENGTHS):
        assert row[2:4] == [interval(*paired_values()[CACHE_PAIRED][(t, s)], 2) for s in ("no_cache", "concat")]
    answers.unlink()  # no answers for the commit: the ratios of asv's medians, marked
    code, out, _ = report(path, "tables", "--experiment", "cache", capsys=capsys)
    assert code == 0 and "(unpaired)" in table_rows(out, CACHE_TITLE)[0][2]


def test_a_skipped_paired_ratio_falls_back_to_the_medians_and_a_failed_one_is_marked(repo, capsys):
    path, hashes = repo
    override = {(CACHE_PAIRED, (64, "concat")): math.nan, (CACHE_PAIRED, (128, "no_cache")): None,
                (CACHE_PAIRED + "_low", (32, "concat")): math.nan, (BATCH_PAIRED, (16,)): math.nan,
                (SWEEP_PAIRED, (4,)): None}
    write_run(path / ".asv/results", hashes[2], paired=True, override=override)
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0
    paired, (_, batch, sweep) = paired_values(), medians()
    cache = {int(r[0]): r for r in table_rows(out, CACHE_TITLE)}
    assert cache[64][3] == f"{1.5 / 1.25:.2f}x (unpaired)"
    assert cache[64][2] == interval(*paired[CACHE_PAIRED][(64, "no_cache")], 2)
    assert cache[128][2] == "failed"
    assert cache[32][3] == f"{paired[CACHE_PAIRED][(32, 'concat')][0]:.2f}x"  # no interval stored: none shown
    batch_rows = {int(r[0]): r for r in table_rows(out, BATCH_TITLE)}
    assert batch_rows[16][1] == f"{batch[(16, 'sequential')] / batch[(16, 'batched')]:.3f}x (unpaired)"
    assert batch_rows[32][1] == interval(*paired[BATCH_PAIRED][(32,)], 3)
    sweep_rows = {int(r[0]): r for r in table_rows(out, SWEEP_TITLE)}
    assert sweep_rows[4][4] == "failed" and sweep_rows[8][4] == interval(*paired[SWEEP_PAIRED][(8,)], 3)


def test_the_speedup_plot_draws_the_paired_values(repo):
    plt = pytest.importorskip("matplotlib.pyplot")
    from tools.report import plots

    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], paired=True)
    fig = plots._batch_per_step(plt, load(path, hashes[2]), "t", lab=False)
    bars = fig.axes[1].containers[0]  # the speedup with its 95 % interval as error bars
    points = [paired_values()[BATCH_PAIRED][(t,)] for t in LENGTHS]
    assert list(bars.lines[0].get_ydata())[:5] == pytest.approx([m for m, _, _ in points])
    segments = bars.lines[2][0].get_segments()[:5]
    assert [y for seg in segments for y in (seg[0][1], seg[1][1])] == pytest.approx(
        [y for _, lo, hi in points for y in (lo, hi)])
    plt.close(fig)


def test_the_batch_figure_draws_each_step_from_the_pairs_and_the_saving_with_its_interval(repo):
    plt = pytest.importorskip("matplotlib.pyplot")
    from tools.report import plots

    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], paired=True)
    fig = plots._batch_per_step(plt, load(path, hashes[2]), "t", lab=True)
    drawn = lines_of(fig)
    assert drawn["sequential, per step"][:5] == pytest.approx([30 + t * 1e-2 for t in LENGTHS])  # µs
    assert drawn["batched, per step"][:5] == pytest.approx([18 + t * 1e-2 for t in LENGTHS])
    saved = fig.axes[0].containers[2]
    assert list(saved.lines[0].get_ydata())[:5] == pytest.approx([12.0] * 5)
    assert [y for s in saved.lines[2][0].get_segments()[:5] for y in (s[0][1], s[1][1])] == pytest.approx(
        [11.0, 13.5] * 5)
    assert fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel() and fig.axes[1].get_ylabel()
    plt.close(fig)


def test_tables_name_commit_machine_environment_and_sample_count(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[1], n_samples=13)
    code, out, _ = report(path, "tables", "--commit", "HEAD~1", capsys=capsys)
    assert code == 0
    head = out.split("###", 1)[0]
    assert hashes[1][:8] in head and "`box`" in head and "Test CPU" in head and "2 CPUs" in head
    assert f"environment `{ENV}`" in head
    assert "median of 13 samples" in head


def test_default_commit_is_the_newest_with_results(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[0], date=3_000, scale=2.0)  # newest by commit date
    write_run(path / ".asv/results", hashes[2], date=2_000)
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0 and f"`{hashes[0][:8]}`" in out.splitlines()[0]
    assert float(table_rows(out, SWEEP_TITLE)[0][1]) == pytest.approx(2 * 2e-3 * 1e3)


def test_failed_and_skipped_points_are_marked_and_the_rest_renders(repo, capsys):
    path, hashes = repo
    override = {(CACHE, (64, "preallocated")): None, (CACHE, (32, "concat")): math.nan,
                (BATCH, (128, "batched")): None, (SWEEP, 1): math.nan}
    write_run(path / ".asv/results", hashes[2], override=override)
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0
    cache = {int(r[0]): r for r in table_rows(out, CACHE_TITLE)}
    assert cache[64][1:4] == ["failed"] * 3  # the check and the ratios carry the mark
    assert cache[32][1] == "n/a" and cache[32][2].endswith("x (unpaired)") and cache[32][3] == "n/a"  # concat skipped
    batch = {int(r[0]): r for r in table_rows(out, BATCH_TITLE)}
    assert batch[128][1] == "failed" and batch[64][1] == "1.500x (unpaired)"
    sweep = {int(r[0]): r for r in table_rows(out, SWEEP_TITLE)}
    assert sweep[1][1:] == ["n/a"] * 4
    assert all(c == "n/a" for c in (sweep[2][4], sweep[8][4]))  # no B = 1 rate to scale against
    assert sweep[8][3] == f"{8 * 128 / medians()[2][8]:,.0f}"


def test_a_benchmark_missing_from_an_older_run_shows_n_a(repo, capsys):
    path, hashes = repo
    run = write_run(path / ".asv/results", hashes[2])
    data = json.loads(run.read_text())
    del data["results"][SWEEP]
    run.write_text(json.dumps(data))
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0
    assert [r[1:] for r in table_rows(out, SWEEP_TITLE)] == [["n/a"] * 4] * 4


# --- csv --------------------------------------------------------------------------------------------


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_has_one_row_per_recorded_sample(repo, capsys, tmp_path):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[1], n_samples=10)
    write_run(path / ".asv/results", hashes[2], n_samples=12,
              override={(CACHE, (16, "concat")): None, (CACHE, (32, "concat")): math.nan})
    out_file = tmp_path / "samples.csv"
    code, out, _ = report(path, "csv", "--out", str(out_file), capsys=capsys)
    assert code == 0
    rows = read_csv(out_file)
    points = 15 + 10 + 4
    assert len(rows) == points * 10 + (points - 2) * 12
    assert list(rows[0])[:9] == ["commit", "machine", "benchmark", "experiment", "strategy", "T", "B",
                                 "sample", "seconds"]
    assert f"wrote {len(rows)} rows" in out
    at = [r for r in rows if r["commit"] == hashes[2] and r["benchmark"] == CACHE
          and r["T"] == "64" and r["strategy"] == "no_cache"]
    assert [int(r["sample"]) for r in at] == list(range(12))
    median = medians()[0][(64, "no_cache")]
    assert sorted(float(r["seconds"]) for r in at)[6] == pytest.approx(median * 1.0)
    assert {r["experiment"] for r in rows} == {"cache", "batch", "batch_size"}
    assert {r["B"] for r in rows if r["experiment"] == "cache"} == {""}
    assert {r["B"] for r in rows if r["experiment"] == "batch"} == {"2"}
    assert {(r["T"], r["strategy"]) for r in rows if r["experiment"] == "batch_size"} == {("128", "batched")}
    assert {r["machine"] for r in rows} == {"box"}


def test_csv_makes_missing_parent_directories(repo, capsys, tmp_path):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], n_samples=2)
    code, _, _ = report(path, "csv", "--out", str(tmp_path / "report/deeper/s.csv"), capsys=capsys)
    assert code == 0 and len(read_csv(tmp_path / "report/deeper/s.csv")) == 29 * 2


def test_csv_without_samples_says_so_and_writes_no_rows(repo, capsys, tmp_path):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], n_samples=0)
    out_file = tmp_path / "stats.csv"
    code, _, err = report(path, "csv", "--out", str(out_file), capsys=capsys)
    assert code == 0 and "29 points have no recorded samples" in err and "--record-samples" in err
    assert read_csv(out_file) == []


def test_a_machine_named_in_bytes_that_are_not_utf8_is_written_as_those_bytes(repo, capsys, tmp_path):
    """asv names a machine's folder as the user did; csv and plots write it, never a traceback."""
    pytest.importorskip("matplotlib")
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], machine="vm-\udcff", env="env-\udcfe")  # b"vm-\xff" on disk
    code, _, err = report(path, "csv", "--out", str(tmp_path / "s.csv"), capsys=capsys)
    assert code == 0, err
    rows = (tmp_path / "s.csv").read_bytes().splitlines()[1:]
    assert rows and all(b",vm-\xff," in row and row.endswith(b",env-\xfe") for row in rows)
    code, out, err = report(path, "plots", "--out", str(tmp_path / "figs"), capsys=capsys)
    assert code == 0 and out.count("wrote") == 2, err


# --- plots ------------------------------------------------------------------------------------------


def test_plots_are_written_and_open_as_images(repo, capsys, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], override={(CACHE, (16, "concat")): None})
    code, out, _ = report(path, "plots", "--out", str(tmp_path / "figs"), capsys=capsys)
    assert code == 0
    names = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert names == ["batch_per_step.png", "model.png"]
    for name in names:
        pixels = image.imread(tmp_path / "figs" / name)
        assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300
        assert pixels.std() > 0  # not a blank canvas
    code, out, _ = report(path, "plots", "--figure", "model", "--out", str(tmp_path / "one"), capsys=capsys)
    assert code == 0 and [p.name for p in (tmp_path / "one").iterdir()] == ["model.png"]


# --- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["tables"], "no asv results directory"),
    (["tables", "--commit", "HEAD"], "no asv results directory"),
])
def test_no_results_directory(repo, capsys, argv, message):
    path, _ = repo
    code, out, err = report(path, *argv, capsys=capsys)
    assert code == 1 and message in err and out == ""


def test_unknown_commit_and_commit_without_results(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2])
    code, _, err = report(path, "tables", "--commit", "no-such-branch", capsys=capsys)
    assert code == 1 and "commit no-such-branch has no results on machine 'box'" in err
    code, _, err = report(path, "tables", "--commit", "HEAD~2", capsys=capsys)
    assert code == 1 and f"commit {hashes[0][:8]} (HEAD~2) has no results on machine 'box'" in err


def test_unknown_machine_and_several_machines(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], machine="box")
    write_run(path / ".asv/results", hashes[2], machine="other")
    code, _, err = report(path, "tables", "--machine", "nope", capsys=capsys)
    assert code == 1 and "no results for machine 'nope'" in err and "box, other" in err
    code, _, err = report(path, "tables", "--results-dir", str(path / ".asv/results"), capsys=capsys)
    if code == 1:  # unless this host's asv machine happens to be one of them
        assert "--machine" in err
    code, out, _ = report(path, "tables", "--machine", "other", capsys=capsys)
    assert code == 0 and "`other`" in out


def test_a_machine_whose_name_is_no_plain_folder_name_can_be_chosen(repo, capsys):
    """asv records any name in machine.json; --machine matches a results folder and is never a path, so "my laptop"
    is taken and a name with '/' matches none."""
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], machine="my laptop")
    write_run(path / ".asv/results", hashes[2], machine="other")
    code, out, err = report(path, "tables", "--machine", "my laptop", capsys=capsys)
    assert code == 0 and "on `my laptop`" in out.splitlines()[0], err
    code, out, err = report(path, "tables", "--machine", "../my laptop", capsys=capsys)
    assert code == 1 and "no results for machine '../my laptop'" in err


def test_several_environments_of_one_commit_are_named(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2])
    write_run(path / ".asv/results", hashes[2], env="conda-py3.12", scale=3.0)
    for commit in (["--commit", "HEAD"], []):  # named, or the newest by default
        code, _, err = report(path, "tables", *commit, capsys=capsys)
        assert code == 1 and "matches several result files" in err and "conda-py3.12" in err


def test_command_line_errors_are_one_line_without_traceback(repo):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2])
    (path / "a_file").write_text("")
    for argv in (["tables", "--commit", "deadbeef"], ["tables", "--results-dir", str(path / "missing")],
                 ["csv", "--out", str(path / "a_file/x.csv")]):
        argv = argv if "--results-dir" in argv else [*argv, "--results-dir", str(path / ".asv/results")]
        proc = subprocess.run([sys.executable, "-m", "tools.dev", "report", *argv], cwd=ROOT,
                              env={**os.environ, common.INSIDE_VENV: "1"}, capture_output=True, text=True)
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert proc.stderr.startswith("tools/dev.py report: error: ")


# --- files that are not what they should be ---------------------------------------------------------


def test_a_stray_file_is_ignored_and_benchmarks_json_is_needed(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2])
    (path / ".asv/results/box/notes.json").write_text("stray")  # not <hash8>-<env>.json: ignored
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0 and "Cache experiment" in out
    (path / ".asv/results/benchmarks.json").write_text("[1]")  # asv's parameter names, as asv compare reads them
    code, _, err = report(path, "tables", capsys=capsys)
    assert code == 1 and "cannot read benchmarks.json" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("edit", [
    lambda d: d["results"][CACHE][0].__setitem__(0, "a"),  # text where seconds belong
    lambda d: d["results"][SWEEP][COLUMNS.index("samples")].__setitem__(0, ["a"]),  # a bad sample
    lambda d: d.__setitem__("results", []),
    lambda d: d.__setitem__("commit_hash", None),
    lambda d: d.__setitem__("date", "yesterday"),
    lambda d: d["results"].__setitem__(CACHE, None),
    lambda d: d["results"][SWEEP].__setitem__(0, [1.0]),  # one value for the sweep's four batch sizes
    lambda d: d.__setitem__("commit_hash", "f" * 40),  # not the commit of the file's name
])
def test_a_malformed_result_file_is_an_error_not_a_figure(repo, capsys, edit):
    path, hashes = repo
    run = write_run(path / ".asv/results", hashes[2])
    data = json.loads(run.read_text())
    edit(data)
    run.write_text(json.dumps(data))
    code, out, err = report(path, "tables", "--commit", "HEAD", capsys=capsys)
    assert code == 1 and err.startswith("tools/dev.py report: error: cannot read asv result file") and out == ""


def test_a_full_hash_of_a_commit_git_does_not_know(repo, capsys):
    path, _ = repo
    other = "abcdef12" + "3" * 32
    write_run(path / ".asv/results", other)
    code, out, _ = report(path, "tables", "--commit", other, capsys=capsys)
    assert code == 0 and "`abcdef12`" in out
    code, _, err = report(path, "tables", "--commit", "abcdef12" + "4" * 32, capsys=capsys)
    assert code == 1 and "has no results" in err and other in err
    code, out, _ = report(path, "tables", "--commit", "abc", capsys=capsys)  # the start of a stored commit's hash
    assert code == 0 and "`abcdef12`" in out


def test_csv_leaves_no_partial_file(repo, capsys, tmp_path):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], n_samples=3)
    out_file = tmp_path / "samples.csv"
    code, _, _ = report(path, "csv", "--out", str(out_file), capsys=capsys)
    assert code == 0 and len(read_csv(out_file)) == 29 * 3
    (path / ".asv/results/box" / f"{hashes[2][:8]}-{ENV}.json").write_text("{")
    code, _, err = report(path, "csv", "--out", str(out_file), capsys=capsys)
    assert code == 1 and "cannot read asv result file" in err
    assert len(read_csv(out_file)) == 29 * 3  # the earlier file is left whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_plots_of_a_run_where_every_gate_failed(repo, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path, hashes = repo
    override = {(name, key): None for name, keys in (
        (CACHE, [(t, s) for t in LENGTHS for s in ("no_cache", "concat", "preallocated")]),
        (BATCH, [(t, s) for t in LENGTHS for s in ("sequential", "batched")]),
        (SWEEP, [1, 2, 4, 8])) for key in keys}
    write_run(path / ".asv/results", hashes[2], override=override)
    code, out, _ = report(path, "plots", "--out", str(tmp_path / "figs"), capsys=capsys)
    assert code == 0 and sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["batch_per_step.png", "model.png"]
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0 and table_rows(out, CACHE_TITLE)[0][1:4] == ["failed"] * 3


def test_csv_rows_of_the_heads_and_ragged_experiments(repo, capsys, tmp_path):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], n_samples=4, extra=True)
    out_file = tmp_path / "all.csv"
    code, _, _ = report(path, "csv", "--out", str(out_file), capsys=capsys)
    assert code == 0
    rows = read_csv(out_file)
    assert len(rows) == (29 + 18 + 9) * 4  # only time_ benchmarks have samples
    heads = [r for r in rows if r["experiment"] == "heads"]
    assert len(heads) == 18 * 4 and {r["strategy"] for r in heads} == {""}
    assert {(r["T"], r["params"]) for r in heads if r["sample"] == "0" and r["T"] == "64"} == {
        ("64", f"kind={k} path={p}") for k in KINDS for p in ("repeat_kv", "grouped")}
    ragged = [r for r in rows if r["experiment"] == "ragged"]
    assert {(r["strategy"], r["T"], r["params"]) for r in ragged} == {
        (s, "", f"lengths={d}") for s in ("padded", "compacted", "paged") for d in DISTRIBUTIONS}


# --- the lab's four questions: concat / preallocated, heads and ragged plots, the lab's own figures ----

# The lab's README, as published: its no_cache / preallocated column, to check the copied times against.
LAB_NO_CACHE_RATIO = [1.51, 2.01, 3.02, 6.61, 16.18]


def test_the_lab_times_copied_agree_with_the_lab_s_own_ratios():
    from tools.report import lab, tables

    assert list(lab.CACHE_MS) == list(lab.BATCH_SPEEDUP) == LENGTHS
    assert [round(r, 2) for r in tables.LAB_CACHE_RATIOS["no_cache"].values()] == LAB_NO_CACHE_RATIO
    assert 1 - lab.CACHE_MS[256]["preallocated"] / lab.CACHE_MS[256]["concat"] == pytest.approx(0.186, abs=5e-4)


def test_tables_can_show_one_experiment(repo, capsys):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[1])
    write_run(path / ".asv/results", hashes[2], extra=True)
    code, out, _ = report(path, "tables", "--experiment", "cache", "--experiment", "ragged", capsys=capsys)
    assert code == 0 and re.findall(r"^### (.+)$", out, re.M) == [CACHE_TITLE, RAGGED_TITLE]
    with pytest.raises(SystemExit) as exit_code:
        report(path, "tables", "--experiment", "bogus", capsys=capsys)
    assert exit_code.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_tables_say_when_the_run_was_measured(repo, capsys):
    path, hashes = repo
    run = write_run(path / ".asv/results", hashes[2])
    data = json.loads(run.read_text())
    data["results"][CACHE][COLUMNS.index("started_at")] = 1_700_000_000_000  # 2023-11-14 22:13 UTC
    run.write_text(json.dumps(data))
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0 and "measured 2023-11-14 22:13 UTC" in out.splitlines()[2]


def load(path, commit):
    from tools.results import ResultsDir

    return ResultsDir(str(path / ".asv/results")).load("box", commit[:8])


def lines_of(fig):
    """Label -> y values of every line drawn, error-bar lines by their container's label."""
    drawn = {line.get_label(): list(line.get_ydata()) for ax in fig.axes for line in ax.get_lines()}
    drawn.update({c.get_label(): list(c.lines[0].get_ydata()) for ax in fig.axes for c in ax.containers
                  if hasattr(c, "lines")})
    return drawn


def test_the_speedup_plot_marks_the_lab_s_own_figures(repo):
    plt = pytest.importorskip("matplotlib.pyplot")
    from tools.report import lab, plots

    path, hashes = repo
    write_run(path / ".asv/results", hashes[2])
    run = load(path, hashes[2])
    fig = plots._batch_per_step(plt, run, "t", lab=True)
    speedup = {line.get_label(): list(line.get_ydata()) for line in fig.axes[1].get_lines()}
    assert lines_of(fig)["this machine [95 % interval]"][:5] == pytest.approx([1.5] * 5)
    assert speedup[f"{lab.LABEL}: another machine"] == pytest.approx([1.687, 1.653, 1.611, 1.499, 1.346])
    assert speedup["1x: no saving"] == [1, 1]  # a labelled reference line
    plt.close(fig)
    fig = plots._batch_per_step(plt, run, "t", lab=False)
    assert not any(lab.LABEL in label for label in lines_of(fig))
    plt.close(fig)


# --- hand-edited and odd files: one line, never a traceback, never a hang (issue 12) -------------------


@pytest.mark.parametrize("edit", [
    lambda d: d["results"][CACHE][0].__setitem__(0, 10**400),  # OverflowError as a float
    lambda d: d["results"][CACHE][COLUMNS.index("stats_q_25")].__setitem__(0, 10**400),
    lambda d: d["results"][SWEEP][COLUMNS.index("samples")].__setitem__(0, [10**400]),
    lambda d: d.__setitem__("date", 10**400),
    lambda d: d["results"][SWEEP][1].__setitem__(0, ["1", "2", "4", str(10**400)]),  # a parameter
])
def test_out_of_range_numbers_are_one_line_errors(repo, edit):
    path, hashes = repo
    run = write_run(path / ".asv/results", hashes[2])
    data = json.loads(run.read_text())
    edit(data)
    run.write_text(json.dumps(data))
    for command in (["tables"], ["csv", "--out", str(path / "out.csv")]):
        proc = subprocess.run([sys.executable, "-m", "tools.dev", "report", *command, "--results-dir",
                               str(path / ".asv/results")], cwd=ROOT, env={**os.environ, common.INSIDE_VENV: "1"},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "cannot read asv result file" in proc.stderr
        assert len(proc.stderr) < 600  # a huge number is shortened, not printed whole


def test_deeply_nested_json_is_a_one_line_error(repo, capsys):
    path, hashes = repo
    run = write_run(path / ".asv/results", hashes[2])
    run.write_text("[" * 100_000 + "]" * 100_000)  # RecursionError in the JSON decoder before
    code, out, err = report(path, "tables", capsys=capsys)
    assert code == 1 and "cannot read asv result file" in err and len(err.strip().splitlines()) == 1
    (path / ".asv/results/benchmarks.json").write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = report(path, "tables", capsys=capsys)
    assert code == 1 and "cannot read benchmarks.json" in err and len(err.strip().splitlines()) == 1


def test_fifos_in_the_results_directory_are_skipped(repo, capsys):
    """A FIFO named benchmarks.json hung ``report tables`` forever; a FIFO result file is skipped."""
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2])
    os.mkfifo(path / ".asv/results/box" / f"{hashes[1][:8]}-{ENV}.json")
    for command in (["tables"], ["csv", "--out", str(path / "out.csv")], ["tables", "--commit", hashes[1]]):
        proc = subprocess.run([sys.executable, "-m", "tools.dev", "report", *command, "--results-dir",
                               str(path / ".asv/results")], cwd=ROOT, env={**os.environ, common.INSIDE_VENV: "1"},
                              capture_output=True, text=True, timeout=60)
        assert "Traceback" not in proc.stderr
        if command[-1] == hashes[1]:  # the commit whose only result file is the FIFO
            assert proc.returncode == 1 and "has no results" in proc.stderr
        else:
            assert proc.returncode == 0, proc.stderr
    assert float(read_csv(path / "out.csv")[0]["seconds"]) > 0
    (path / ".asv/results/benchmarks.json").unlink()
    os.mkfifo(path / ".asv/results/benchmarks.json")
    code = dev.main(["report", "tables"])
    assert code == 1 and "a FIFO, not a regular file" in capsys.readouterr().err


def test_the_samples_per_point_are_those_of_the_tables_shown(repo, capsys):
    path, hashes = repo
    run = write_run(path / ".asv/results", hashes[2], n_samples=11, extra=True)
    data = json.loads(run.read_text())
    repeats = data["results"][HEADS][COLUMNS.index("stats_repeat")]
    data["results"][HEADS][COLUMNS.index("stats_repeat")] = [None if r is None else 2 for r in repeats]
    run.write_text(json.dumps(data))
    code, out, _ = report(path, "tables", "--experiment", "cache", "--experiment", "batch", capsys=capsys)
    assert code == 0 and "no asv timing shown" in out  # paired figures only
    code, out, _ = report(path, "tables", "--experiment", "batch_size", capsys=capsys)
    assert code == 0 and "median of 11 samples per point" in out
    code, out, _ = report(path, "tables", capsys=capsys)
    assert code == 0 and "median of 2–11 samples per point" in out
