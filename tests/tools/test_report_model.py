"""The report's model experiment (tools/report/tables.py, plots.py): the step per T and cache kind, the batch sweep,
the exact bytes in the note, and model.png."""

import datetime

import pytest

from tools.report import tables
from tools.results import FAILED, Point, Run

STEP, BATCH = tables.MODEL_STEP, tables.MODEL_BATCH


def run_of(values):
    """A Run holding ``values``: (benchmark, params dict as tuple of items) -> value."""
    points = {(benchmark, tuple(sorted(params))): Point(benchmark, dict(params), value)
              for (benchmark, params), value in values.items()}
    return Run("0" * 40, "box", "env", datetime.datetime(2026, 1, 1), {}, {}, points)


STATIC = (("T", 4096), ("cache", "static"))
VALUES = {
    (STEP + "ratio", STATIC): 0.48, (STEP + "ratio_low", STATIC): 0.45, (STEP + "ratio_high", STATIC): 0.53,
    (STEP + "token_seconds", STATIC): 0.0545, (STEP + "step_gbps", STATIC): 13.3, (STEP + "read_gbps", STATIC): 26.3,
    (STEP + "ratio", (("T", 4096), ("cache", "dynamic"))): FAILED,
    (BATCH + "ratio", (("B", 8), ("T", 256))): 2.5, (BATCH + "ratio_low", (("B", 8), ("T", 256))): 2.4,
    (BATCH + "ratio_high", (("B", 8), ("T", 256))): 2.7, (BATCH + "positions_per_second", (("B", 8), ("T", 256))): 85.0,
    (tables.MODEL_BLAS, (("B", 8),)): 5.0, (tables.MODEL_BLAS + "_low", (("B", 8),)): 4.9,
    (tables.MODEL_BLAS + "_high", (("B", 8),)): 5.1,
    (tables.MODEL_CACHE_BYTES, (("cache", "quantized"),)): 9810.0,
}


def test_the_step_table_shows_time_fraction_rates_and_the_suites_bytes():
    table = tables.model_table(run_of(VALUES))
    rows = dict(table.rows)
    assert list(rows) == [(4096, "dynamic"), (4096, "static")]  # the run's T and kinds, in the suite's order
    text = tables.render_table(table)
    line = next(row for row in text.splitlines() if "static" in row and "4096" in row)
    assert "54.500" in line and "48.0% [45.0, 53.0]" in line and "13.30" in line and "26.30" in line
    assert f"{(538_060_032 + 4097 * 46_080) / 2**20:,.2f} MiB" in line  # every weight, K/V of T + 1 positions
    assert rows[(4096, "dynamic")]["fraction of read bandwidth"] == FAILED
    assert "SmolLM-135M: weights 538,060,032 bytes, K/V 46,080 a token, equal at B x T = 11,677" in table.note
    assert "Llama-3-8B: weights 15,009,849,344 bytes, K/V 131,072 a token, equal at B x T = 114,516" in table.note
    assert "quantized 9,810" in table.note  # the bytes are the suite's arithmetic; a cache's, the run's


def test_the_batch_table_shows_positions_per_second_and_b_equals_1_from_the_same_pairs():
    rows = dict(tables.model_batch_table(run_of(VALUES)).rows)
    cells = rows[(256, 8)]
    assert cells["positions / s"] == 85.0 and cells["B = 1, same pairs"] == pytest.approx(85.0 / 2.5)
    assert (cells["over B = 1"].low, cells["over B = 1"].high) == (2.4, 2.7)
    assert (cells["BLAS alone"], cells["BLAS alone"].low, cells["BLAS alone"].high) == (5.0, 4.9, 5.1)
    old = {(b, tuple((k, v) for k, v in p if k != "T")): v for (b, p), v in VALUES.items()}  # before T: B only
    assert dict(tables.model_batch_table(run_of(old)).rows)[(256, 8)]["over B = 1"] == 2.5


def test_the_model_tables_show_by_default_only_where_the_run_measured_them():
    assert "model" not in [t.title.split(":")[0] for t in tables.all_tables(run_of({}))]
    titles = [t.title for t in tables.all_tables(run_of(VALUES))]
    assert titles[-2:] == [tables.model_table(run_of({})).title, tables.model_batch_table(run_of({})).title]


def test_model_png_draws_each_side_and_the_crossover(tmp_path):
    pytest.importorskip("matplotlib")
    from tools.report import plots

    plt = plots._pyplot()
    fig = plots._model(plt, run_of(VALUES), "t", lab=False)
    labels = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    assert list(labels["equal at B x T = 11,677"].get_xdata()) == [538_060_032 / 46_080]
    assert list(labels["SmolLM-135M: weights"].get_ydata())[0] == 538_060_032
    linear = labels["linear from B = 1: weights read once a step"]
    assert list(linear.get_xdata()) == [1, 8] and list(linear.get_ydata()) == pytest.approx([34.0, 8 * 34.0])
    bars = [c for c in fig.axes[2].containers][0]  # the positions/s with the ratio's interval, as positions/s
    (segments,) = [c for c in bars.lines[2]]
    low, high = segments.get_segments()[-1][:, 1]
    assert (low, high) == pytest.approx((85.0 * 2.4 / 2.5, 85.0 * 2.7 / 2.5))
    plt.close(fig)
