"""The report's roofline table (tools/report/tables.py): the fraction per shape, T, B and path, beside GB/s."""

import datetime

from benchmarks import bench_roofline
from tools.report import tables
from tools.results import FAILED, SKIPPED, Point, Run

FRACTION = "bench_roofline.Roofline.track_ratio"
STEP = "bench_roofline.Roofline.track_step_gbps"
READ = "bench_roofline.Roofline.track_read_gbps"


def run_of(values):
    """A Run holding ``values``: (benchmark, shape, T, B, path) -> value."""
    points = {}
    for (benchmark, shape, t, b, path), value in values.items():
        params = {"shape": shape, "T": t, "B": b, "path": path}
        points[(benchmark, tuple(sorted(params.items())))] = Point(benchmark, params, value)
    return Run("0" * 40, "box", "env", datetime.datetime(2026, 1, 1), {}, {}, points)


def test_each_point_shows_its_bytes_fraction_interval_rates_and_step_time():
    gqa, mha = ("Llama-3-8B", 16384, 1, "grouped"), ("Llama-2-7B", 16384, 4, "grouped")
    run = run_of({(FRACTION, *gqa): 0.34, (FRACTION + "_low", *gqa): 0.33,
                  (FRACTION + "_high", *gqa): 0.355, (STEP, *gqa): 6.8, (READ, *gqa): 20.0,
                  (FRACTION, *mha): SKIPPED, (STEP, *mha): SKIPPED,
                  (READ, *mha): SKIPPED})
    table = tables.roofline_table(run)
    rows = dict(table.rows)
    # every combination of the values the run holds, in the suite's order: shapes, T, B, path
    assert list(rows) == [("Llama-3-8B", 16384, 1, "grouped"), ("Llama-3-8B", 16384, 4, "grouped"),
                          ("Llama-2-7B", 16384, 1, "grouped"), ("Llama-2-7B", 16384, 4, "grouped")]
    cells = rows[gqa]
    nbytes = bench_roofline.step_bytes(*gqa)  # the suite's arithmetic: 160 MiB of weights, 128 MiB of K/V
    assert nbytes == 4 * 4096 * 128 * (2 * 32 + 2 * 8) + 4 * 2 * 8 * 16385 * 128
    assert cells["bytes / step"] == nbytes and cells["step GB/s"] == 6.8 and cells["read GB/s"] == 20.0
    assert abs(cells["step / ms"] - nbytes / 6.8e9) < 1e-12  # bytes over the step's rate
    text = tables.render_table(table)
    line = next(row for row in text.splitlines() if "Llama-3-8B" in row and "|   1 |" in row)
    assert "34.0% [33.0, 35.5]" in line and "288.01 MiB" in line and "6.80" in line and "20.00" in line
    assert f"{nbytes / 6.8e9 * 1e3:.3f}" in line
    skipped = next(row for row in text.splitlines() if "Llama-2-7B" in row and "|   4 |" in row)
    assert skipped.count("n/a") == 4 and "2,304.12 MiB" in skipped  # the bytes are a formula: shown


def test_a_failed_fraction_is_marked():
    point = ("Llama-3-8B", 1024, 1, "repeat_kv")
    run = run_of({(FRACTION, *point): FAILED, (STEP, *point): FAILED, (READ, *point): FAILED})
    cells = dict(tables.roofline_table(run).rows)[point]
    assert cells["fraction of read bandwidth"] == FAILED and cells["step / ms"] == FAILED


def test_the_default_tables_show_the_roofline_only_where_the_run_measured_it():
    point = ("Llama-3-8B", 1024, 1, "grouped")
    without, with_it = run_of({}), run_of({(FRACTION, *point): 0.5})
    assert [t.title for t in tables.all_tables(without)] == [tables.TABLES[n](without).title
                                                              for n in ("cache", "batch", "batch_size", "heads",
                                                                        "ragged")]
    assert [t.title.split(":")[0] for t in tables.all_tables(with_it)[-2:]] == ["Roofline experiment", "Beyond the lab"]
    assert [t.title for t in tables.all_tables(without, ["roofline"])] == [tables.roofline_table(without).title]


def test_a_roofline_table_alone_says_it_shows_no_timing():
    run = run_of({(FRACTION, "Llama-3-8B", 1024, 1, "grouped"): 0.5})
    lines = tables.describe(run, ["roofline"])
    assert lines[-1].startswith("- no asv timing shown: each figure is a value asv tracked once for the commit")
    assert tables.describe(run, ["heads", "roofline"])[-1].startswith("- each time is asv's median of")
