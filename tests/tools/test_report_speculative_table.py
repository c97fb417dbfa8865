"""The report's speculative table (tools/report/tables.py): counts per prompt and k, the paired speedup at k = 10."""

import datetime

from tools.report import tables
from tools.results import Point, Run

COUNTS = "bench_speculative.SpeculativeCounts.track_"
RATIO = "bench_speculative.SpeculativeRatios.track_ratio"


def run_of(values):
    """A Run holding ``values``: (benchmark, params dict items) -> value."""
    points = {(b, tuple(sorted(params))): Point(b, dict(params), v) for (b, params), v in values.items()}
    return Run("0" * 40, "box", "env", datetime.datetime(2026, 1, 1), {}, {}, points)


def test_each_prompt_and_k_shows_its_counts_and_k_10_its_paired_speedup():
    values = {}
    for prompt, k, forwards, accepted in (("copy", 3, 0.375, 10), ("copy", 10, 0.3125, 11), ("story", 3, 1.0, 0),
                                          ("story", 10, 1.0, 0)):
        values[(COUNTS + "forwards_per_token", (("k", k), ("prompt", prompt)))] = forwards
        values[(COUNTS + "accepted_tokens", (("k", k), ("prompt", prompt)))] = accepted
    for prompt, ratio in (("copy", (1.61, 1.55, 1.66)), ("story", (0.78, 0.75, 0.80))):
        for suffix, value in zip(("", "_low", "_high"), ratio):
            values[(RATIO + suffix, (("prompt", prompt),))] = value
    table = tables.speculative_table(run_of(values))
    rows = dict(table.rows)
    assert list(rows) == [("copy", 3), ("copy", 10), ("story", 3), ("story", 10)]
    assert rows[("copy", 10)]["forwards / token"] == 0.3125 and rows[("copy", 10)]["drafts accepted"] == 11
    text = tables.render_table(table)
    copy_10 = next(line for line in text.splitlines() if "copy" in line and "1.61x" in line)
    assert "0.312" in copy_10 and "1.61x [1.55, 1.66]" in copy_10
    assert "n/a" in next(line for line in text.splitlines() if "story" in line and "1.000" in line)  # k = 3: no ratio
    assert tables.all_tables(run_of(values))[-1].title == "Speculative decoding: prompt lookup"
