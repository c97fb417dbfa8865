"""The quantized cache's figure (tools/report/plots.py): error vs bytes per position, beside the anchors' widths."""

import datetime

import pytest

from tools.report import plots, tables
from tools.results import Point, Run

KINDS = ("int2", "int4", "int8", "float8_e4m3fn", "float8_e5m2")


def run_of(values):
    """A Run holding ``{(T, kind): (bytes, error)}``; a value may be "FAILED"."""
    points = {}
    for (t, kind), (nbytes, error) in values.items():
        params = tuple(sorted({"T": t, "kind": kind}.items()))
        points[(tables.QUANTIZED_BYTES, params)] = Point(tables.QUANTIZED_BYTES, dict(params), nbytes)
        points[(tables.QUANTIZED_ERROR, params)] = Point(tables.QUANTIZED_ERROR, dict(params), error)
    return Run("a" * 40, "machine", "env", datetime.datetime(2026, 1, 1), {}, {}, points)


def test_one_point_per_configuration_beside_the_published_bit_widths():
    plt = pytest.importorskip("matplotlib.pyplot")
    values = {(t, kind): (100.0 * (i + 1) / t * 64, 0.5 / (i + 1) / t * 64) for i, kind in enumerate(KINDS)
              for t in (64, 128)}
    values[(128, "int8")] = ("FAILED", 0.1)  # a failed point leaves its configuration's line one point short
    fig = plots.error_vs_bytes(plt, run_of(values), "t", lab=False)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    for kind in KINDS:
        expected = [values[(t, kind)] for t in (64, 128) if values[(t, kind)][0] != "FAILED"]
        assert list(lines[kind].get_xdata()) == pytest.approx([b for b, _ in expected])
        assert list(lines[kind].get_ydata()) == pytest.approx([e for _, e in expected])
    vertical = sorted({line.get_xdata()[0] for line in ax.get_lines()
                       if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]})
    assert vertical == [16, 32, 48, 64, 128, 1024]  # 1, 2, 3, 4, 8 bits of 128 elements; the float64 cache
    labels = [t.get_text().strip() for t in ax.texts]  # each reference line labelled where it is drawn
    assert labels == ["1 bit: HF HQQ", "2 bits: KIVI, HF quanto, HF HQQ", "3 bits: HF HQQ",
                      "4 bits: KIVI, HF quanto, HF HQQ", "8 bits: HF HQQ", "float64 cache, error 0"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [*KINDS, "T = 64 decode steps", "T = 128 decode steps"]
    assert ax.get_legend().get_bbox_to_anchor().x0 > ax.bbox.x1  # beside the axes: it hides no point
    assert ax.get_yscale() == "log"
    plt.close(fig)


def test_a_run_without_the_experiment_says_so():
    plt = pytest.importorskip("matplotlib.pyplot")
    fig = plots.error_vs_bytes(plt, run_of({}), "t", lab=False)
    assert "no measured points" in [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)

