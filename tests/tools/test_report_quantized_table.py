"""The report's quantized table (tools/report/tables.py): one row per kind at the decode's longest T."""

import datetime

from tools.report import tables
from tools.results import SKIPPED, Point, Run

BYTES = "bench_quantized.QuantizedAccuracy.track_bytes_per_position"
ERROR = "bench_quantized.QuantizedAccuracy.track_max_abs_error"
DECODE = "bench_quantized.QuantizedDecode.time_decode"
RATIO = "bench_quantized.QuantizedRatios.track_ratio"
FUSED = "bench_quantized.FusedRatios.track_ratio"


def run_of(values):
    """A Run holding ``values``: (benchmark, T, kind) -> value."""
    points = {}
    for (benchmark, t, kind), value in values.items():
        params = {"T": t, "kind": kind}
        points[(benchmark, tuple(sorted(params.items())))] = Point(benchmark, params, value)
    return Run("0" * 40, "box", "env", datetime.datetime(2026, 1, 1), {}, {}, points)


def test_each_kind_shows_its_exact_bytes_and_error_its_time_and_paired_ratios():
    run = run_of({(BYTES, 128, "int4"): 352, (ERROR, 128, "int4"): 0.1375, (DECODE, 128, "int4"): 0.0123,
                  (RATIO, 128, "int4"): 3.69, (RATIO + "_low", 128, "int4"): 3.56, (RATIO + "_high", 128, "int4"): 3.77,
                  (FUSED, 128, "int4"): 0.99, (FUSED, 1024, "int4"): 0.51,
                  (BYTES, 64, "int4"): 999, (BYTES, 128, "int2"): 328, (ERROR, 128, "int2"): SKIPPED})
    table = tables.quantized_table(run)
    rows = dict(table.rows)
    assert list(rows) == [("int2",), ("int4",)]  # the suite's order of kinds, those the run holds
    cells = rows[("int4",)]
    assert cells["bytes / position"] == 352 and cells["max abs error"] == 0.1375  # T = 128, not the 64 point
    assert cells["decode / ms"] == 0.0123 and cells["from the codes, T = 1024"] == 0.51
    line = next(row for row in tables.render_table(table).splitlines() if "int4" in row)
    assert " 352 |" in line and "0.14" in line and "12.300" in line and "3.69x [3.56, 3.77]" in line
    assert "0.99x (unpaired)" not in line and "0.99x" in line  # a paired ratio without its interval
    assert tables.render_table(table).count("n/a") >= 1  # int2's missing error


def test_the_default_tables_show_the_quantized_table_only_where_the_run_measured_it():
    without, with_it = run_of({}), run_of({(BYTES, 128, "int8"): 400})
    assert all(not t.title.startswith("Quantized") for t in tables.all_tables(without))
    assert tables.all_tables(with_it)[-1].title == "Quantized KV cache at T = 128"
