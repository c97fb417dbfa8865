"""The lab's figures for one run, drawn with matplotlib (the optional ``plots`` extra).

- ``time_vs_T.png``: median decode time vs T per strategy, log-log, with the
  interquartile range as error bars, for the cache and the batch experiment;
- ``ratios_vs_T.png``: no_cache / preallocated and the batched speedup vs T;
- ``positions_vs_B.png``: positions/s vs B at T = 128, with linear scaling from B = 1.

A failed or skipped point leaves a gap in its line; the commit and machine are in every title.
"""

import math
import os

from benchmarks.common import SWEEP_LENGTH

from .. import paths
from ..common import UserError
from ..results import is_number
from .tables import (BATCH_BENCHMARK, CACHE_BENCHMARK, CACHE_STRATEGIES, batch_size_table,
                     batch_table, cache_table)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            "plots need matplotlib: pip install -e '.[plots]' (tables and csv work without it)"
        ) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _log2_axis(ax, ticks):
    """A base-2 log x axis labelled with the measured values (16, 32, ...) rather than powers."""
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()


def _series(run, benchmark, strategy, lengths):
    """Per T in ``lengths``: median ms, and its distance to the quartiles; NaN where no time was measured."""
    median, below, above = [], [], []
    for t in lengths:
        point = run.points.get((benchmark, (("T", t), ("strategy", strategy))))
        ok = point is not None and is_number(point.value)
        v = point.value if ok else math.nan
        median.append(v * 1e3)
        below.append(max(0.0, v - point.stats.get("q_25", v)) * 1e3 if ok else 0.0)
        above.append(max(0.0, point.stats.get("q_75", v) - v) * 1e3 if ok else 0.0)
    return median, [below, above]


def _numbers(table, figure):
    """(keys, values) of a table column; NaN where the cell is failed or n/a, so the line breaks there."""
    rows = [(key, cells[figure]) for (key,), cells in table.rows if is_number(key)]
    return [key for key, _ in rows], [v if is_number(v) else math.nan for _, v in rows]


def _finish(ax, keys, values, log_y=False):
    """Axis scales, grid and legend; a note instead of a log scale when nothing was measured."""
    _log2_axis(ax, keys)
    if any(math.isfinite(v) for v in values):
        if log_y:
            ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
    ax.grid(True, which="both", alpha=0.3)


def _time_vs_t(plt, run, title):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    panels = [(axes[0], cache_table(run), CACHE_BENCHMARK, CACHE_STRATEGIES, "cache: one sequence"),
              (axes[1], batch_table(run), BATCH_BENCHMARK, ("sequential", "batched"), "batch: B = 2 sequences")]
    for ax, table, benchmark, strategies, name in panels:
        lengths = [t for (t,), _ in table.rows if is_number(t)]
        every = []
        for strategy in strategies:
            median, err = _series(run, benchmark, strategy, lengths)
            ax.errorbar(lengths, median, yerr=err, marker="o", capsize=3, label=strategy)
            every += median
        _finish(ax, lengths, every, log_y=True)
        ax.set(xlabel="T (tokens decoded)", title=name)
        ax.legend()
    axes[0].set_ylabel("median decode time (ms)")
    fig.suptitle(f"Decode time vs T — {title}")
    return fig


def _ratios_vs_t(plt, run, title):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, table, figure, label in [
        (axes[0], cache_table(run), "no_cache / preallocated", "no_cache / preallocated (×)"),
        (axes[1], batch_table(run), "speedup", "batched speedup: sequential / batched (×)"),
    ]:
        t, ratio = _numbers(table, figure)
        ax.plot(t, ratio, marker="o")
        _finish(ax, t, ratio)
        ax.set_ylim(bottom=0)  # ratios from zero: small wiggles look small
        ax.set(xlabel="T (tokens decoded)", ylabel=label, title=label)
    fig.suptitle(f"Ratios vs T — {title}")
    return fig


def _positions_vs_b(plt, run, title):
    table = batch_size_table(run)
    b, rate = _numbers(table, "positions / s")
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(b, rate, marker="o", label="measured")
    if b and b[0] == 1 and math.isfinite(rate[0]):
        ax.plot(b, [rate[0] * x for x in b], linestyle="--", color="grey", label="linear from B = 1")
    _finish(ax, b, rate)
    ax.set_xscale("linear")  # so that linear scaling is a straight line
    ax.set_xticks(b, [str(x) for x in b])
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter("{x:,.0f}")
    ax.set(xlabel="B (sequences per batch)", ylabel="positions / s", title=f"Batched decode at T = {SWEEP_LENGTH}")
    ax.legend()
    fig.suptitle(f"Positions/s vs B — {title}", fontsize=10)
    return fig


FIGURES = {"time_vs_T.png": _time_vs_t, "ratios_vs_T.png": _ratios_vs_t, "positions_vs_B.png": _positions_vs_b}


def write_plots(run, out_dir, protected=()):
    """Draw the three figures of ``run`` into ``out_dir`` (created if missing); returns ``[(path, replaced)]``.

    ``out_dir`` and each PNG in it are checked as :mod:`tools.paths` says
    (``protected``: directories such as the results directory no file may go
    into); each PNG is written whole or not at all.

    Raises:
        UserError: matplotlib is not installed, or ``out_dir`` or a PNG may not or cannot be written.
    """
    plt = _pyplot()
    folder = paths.check_dir(out_dir, protected)
    targets = {name: paths.check_file(os.path.join(folder, name), protected, what=os.path.join(out_dir, name))
               for name in FIGURES}  # every check before the first file is written
    title = f"commit {run.commit[:8]} on {run.machine}"
    written = []
    for name, draw in FIGURES.items():
        fig = draw(plt, run, title)
        fig.tight_layout()
        target, replaced = targets[name]
        try:
            with paths.atomic_write(target, binary=True) as f:
                fig.savefig(f, format="png", dpi=110)
        finally:
            plt.close(fig)
        written.append((target, replaced))
    return written
