"""The lab's figures for one run, drawn with matplotlib (the optional ``plots`` extra).

- ``time_vs_T.png``: median decode time vs T per strategy, log-log, with the
  interquartile range as error bars, for the cache and the batch experiment;
- ``batch_per_step.png``: per decode step, the sequential and batched times and
  the saving (with its 95 % interval), all from the speedup's pairs, and the
  speedup with its interval, vs T: why the speedup shrinks;
- ``ratios_vs_T.png``: no_cache / preallocated, concat / preallocated and the
  batched speedup vs T, each paired with its 95 % interval, from zero;
- ``positions_vs_B.png``: positions/s vs B at T = 128, with linear scaling from B = 1;
- ``heads_vs_T.png``: repeat_kv and grouped decode time vs T per attention
  kind (log-log), and repeat_kv / grouped;
- ``ragged.png``: padded, compacted and paged decode time per length
  distribution, and the K/V slots each reserved;
- ``quantized.png``: the quantized cache's error vs bytes per position (:mod:`tools.report.quantized`).

With ``lab=True`` the cache and batch figures also draw the lab's own
published figures (:mod:`tools.report.lab`) as dashed grey lines labelled as
the lab's; the figures of experiments the lab did not publish say so. A failed
or skipped point leaves a gap in its line; the commit and machine are in every title.
"""

import math
import os

from benchmarks import bench_heads, bench_ragged
from benchmarks.common import STRATEGIES, SWEEP_LENGTH

from .. import paths
from ..common import UserError
from ..results import is_number
from . import lab as lab_figures
from .quantized import error_vs_bytes
from .tables import (BATCH_BENCHMARK, CACHE_BENCHMARK, CACHE_RATIOS, HEADS_BENCHMARK, RAGGED_BENCHMARK, Paired,
                     batch_size_table, batch_table, cache_table, heads_table, ragged_table)

LAB_STYLE = {"linestyle": "--", "marker": "s", "markersize": 4, "alpha": 0.8}
NO_LAB_FIGURES = "the lab published no figures for this experiment"


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


def _series(run, benchmark, lengths, **params):
    """Per T in ``lengths``: median ms, and its distance to the quartiles; NaN where no time was measured."""
    median, below, above = [], [], []
    for t in lengths:
        point = run.points.get((benchmark, tuple(sorted({"T": t, **params}.items()))))
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


def _interval(table, figure):
    """(keys, values, [below, above]) of a paired column: its distance to the 95 % interval's ends (0 where none)."""
    keys, values = _numbers(table, figure)
    cells = [cells[figure] for (key,), cells in table.rows if is_number(key)]
    below = [v - c.low if isinstance(c, Paired) and c.low is not None else 0.0 for v, c in zip(values, cells)]
    above = [c.high - v if isinstance(c, Paired) and c.high is not None else 0.0 for v, c in zip(values, cells)]
    return keys, values, [[max(0.0, b) for b in below], [max(0.0, a) for a in above]]


def _reference(ax, y, label, linestyle=":"):
    """A horizontal reference line, labelled in the legend."""
    ax.axhline(y, color="black", linewidth=0.8, linestyle=linestyle, label=label)


def _speedup(ax, run, lab):
    """The batch speedup with its 95 % interval vs T, the lab's published one beside it, 1x and 2x marked."""
    t, speedup, err = _interval(batch_table(run), "speedup")
    ax.errorbar(t, speedup, yerr=err, marker="o", capsize=3, label="this machine [95 % interval]")
    if lab:
        ax.plot(list(lab_figures.BATCH_SPEEDUP), list(lab_figures.BATCH_SPEEDUP.values()), color="grey",
                **LAB_STYLE, label=f"{lab_figures.LABEL}: another machine")
    _reference(ax, 2, "2x: the most B = 2 can save", "-.")
    _reference(ax, 1, "1x: no saving")
    _finish(ax, t, speedup)
    ax.set_ylim(0, 2.2)
    ax.set(xlabel="T (tokens decoded)", ylabel="speedup: sequential / batched (×)", title="batched speedup, B = 2")
    ax.legend(fontsize=8, loc="lower left")


def _finish(ax, keys, values, log_y=False):
    """Axis scales, grid and legend; a note instead of a log scale when nothing was measured."""
    _log2_axis(ax, keys)
    if any(math.isfinite(v) for v in values):
        if log_y:
            ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
    ax.grid(True, which="both", alpha=0.3)


def _no_lab(fig):
    fig.text(0.01, 0.01, NO_LAB_FIGURES, fontsize=8, color="grey")


def _time_vs_t(plt, run, title, lab):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    panels = [(axes[0], CACHE_BENCHMARK, tuple(STRATEGIES["cache"]), "cache: one sequence", lab_figures.cache_seconds),
              (axes[1], BATCH_BENCHMARK, tuple(STRATEGIES["batch"]), "batch: B = 2 sequences",
               lab_figures.batch_seconds)]
    for ax, benchmark, strategies, name, published in panels:
        lengths = sorted({dict(params)["T"] for name, params in run.points if name == benchmark})
        every = []
        for strategy in strategies:
            median, err = _series(run, benchmark, lengths, strategy=strategy)
            line = ax.errorbar(lengths, median, yerr=err, marker="o", capsize=3, label=strategy)
            every += median
            if lab:
                t, seconds = published(strategy)
                ax.plot(t, [s * 1e3 for s in seconds], color=line[0].get_color(), **LAB_STYLE,
                        label=f"{strategy}, {lab_figures.LABEL}")
        _finish(ax, lengths, every, log_y=True)
        ax.set(xlabel="T (tokens decoded)", title=name)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("asv's median decode time (ms), [quartiles]")
    fig.suptitle(f"Decode time vs T, asv's unpaired medians — {title}")
    return fig


def _ratios_vs_t(plt, run, title, lab):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    table = cache_table(run)
    for ax, s in zip(axes, CACHE_RATIOS):
        figure = f"{s} / preallocated"
        t, ratio, err = _interval(table, figure)
        ax.errorbar(t, ratio, yerr=err, marker="o", capsize=3, label="this machine [95 % interval]")
        if lab:
            ax.plot(*lab_figures.ratio(lab_figures.CACHE_MS, s, "preallocated"), color="grey", **LAB_STYLE,
                    label=f"{lab_figures.LABEL}: another machine")
        _reference(ax, 1, "1x: equal cost")
        _finish(ax, t, ratio)
        ax.set_ylim(bottom=0)  # ratios from zero: small wiggles look small
        ax.set(xlabel="T (tokens decoded)", ylabel=f"{figure} (×)", title=figure)
        ax.legend(fontsize=8, loc="lower right" if s == "concat" else "upper left")
    _speedup(axes[2], run, lab)
    fig.suptitle(f"Paired ratios vs T — {title}")
    return fig


def _batch_per_step(plt, run, title, lab):
    """Why the speedup shrinks: per step, the saving stays while the batched step grows (both from the pairs)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    table = batch_table(run)
    every = []
    for figure, label in (("sequential / step, µs", "sequential, per step"),
                          ("batched / step, µs", "batched, per step"),
                          ("saved / step, µs", "saved by batching, per step [95 % interval]")):
        t, seconds, err = _interval(table, figure)
        us = [v * 1e6 for v in seconds]
        axes[0].errorbar(t, us, yerr=[[e * 1e6 for e in side] for side in err], marker="o", capsize=3, label=label)
        every += us
    _finish(axes[0], t, every)
    axes[0].set_ylim(bottom=0)
    axes[0].set(xlabel="T (tokens decoded)", ylabel="time per decode step (µs), one position of each sequence",
                title="per step: the batched step grows, the saving does not")
    axes[0].legend(fontsize=8, loc="upper left")
    _speedup(axes[1], run, lab)
    fig.suptitle(f"Batch experiment, in pairs — {title}")
    return fig


def _positions_vs_b(plt, run, title, lab):
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
    if lab:
        _no_lab(fig)
    fig.suptitle(f"Positions/s vs B — {title}", fontsize=10)
    return fig


def _heads_vs_t(plt, run, title, lab):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    table = heads_table(run)
    kinds = list(dict.fromkeys(kind for (kind, _), _ in table.rows))
    lengths = sorted({t for (_, t), _ in table.rows if is_number(t)})
    every = []
    for kind in kinds:
        for path, style in (("repeat_kv", "--"), ("grouped", "-")):
            median, err = _series(run, HEADS_BENCHMARK, lengths, kind=kind, path=path)
            axes[0].errorbar(lengths, median, yerr=err, marker="o", capsize=3, linestyle=style,
                             label=f"{kind} ({bench_heads.KINDS.get(kind, '?')} K/V heads), {path}")
            every += median
        rows = [(t, cells["repeat_kv / grouped"]) for (k, t), cells in table.rows if k == kind]
        ratios = [r if is_number(r) else math.nan for _, r in rows]
        err = [[r - r.low if isinstance(r, Paired) and r.low is not None else 0.0 for _, r in rows],
               [r.high - r if isinstance(r, Paired) and r.high is not None else 0.0 for _, r in rows]]
        axes[1].errorbar([t for t, _ in rows], ratios, yerr=err, marker="o", capsize=3, label=kind)
    _finish(axes[0], lengths, every, log_y=True)
    axes[0].set(xlabel="T (tokens decoded)", ylabel="median decode time (ms)",
                title=f"B = {bench_heads.HEADS_BATCH}, {bench_heads.HEADS_N_HEADS} query heads")
    axes[0].legend(fontsize=7)
    ratios = [r for (_, _), cells in table.rows for r in [cells["repeat_kv / grouped"]] if is_number(r)]
    _finish(axes[1], lengths, ratios or [math.nan])
    axes[1].set_ylim(bottom=0)
    axes[1].axhline(1, color="black", linewidth=0.8, linestyle=":", label="1x: equal cost")
    axes[1].set(xlabel="T (tokens decoded)", ylabel="repeat_kv / grouped (×)",
                title="repeat_kv / grouped\npaired [95 % interval] where measured so, else asv's medians")
    axes[1].legend()
    if lab:
        _no_lab(fig)
    fig.suptitle(f"Heads: MHA, GQA, MQA decode vs T — {title}")
    return fig


def _ragged(plt, run, title, lab):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    table = ragged_table(run)
    distributions = [key for (key,), _ in table.rows]
    strategies = list(STRATEGIES["ragged"])
    width = 0.8 / len(strategies)
    for i, strategy in enumerate(strategies):
        x = [j + (i - (len(strategies) - 1) / 2) * width for j in range(len(distributions))]
        ms = [cells[f"{strategy} / ms"] for _, cells in table.rows]
        axes[0].bar(x, [v * 1e3 if is_number(v) else math.nan for v in ms], width, label=strategy)
        slots = [cells.get(f"slots, {strategy}", cells.get("slots, compacted")) for _, cells in table.rows]
        axes[1].bar(x, [v if is_number(v) else math.nan for v in slots], width, label=strategy)
    for ax, ylabel in ((axes[0], "median decode time (ms)"), (axes[1], "K/V token slots reserved at the peak")):
        ax.set_xticks(range(len(distributions)), distributions)
        ax.set(xlabel="lengths T_b of the 8 sequences", ylabel=ylabel)
        ax.grid(True, axis="y", alpha=0.3)
        ax.margins(y=0.2)  # room for the legend above the bars
        ax.legend(loc="upper right", ncol=3, fontsize=8)
        if not table.rows:
            ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
    axes[0].set_title("decode time")
    axes[1].set_title(f"K/V slots reserved (paged: block_size {bench_ragged.BLOCK_SIZE})")
    if lab:
        _no_lab(fig)
    fig.suptitle(f"Ragged batch: padded vs compacted vs paged — {title}")
    return fig


FIGURES = {"batch_per_step.png": _batch_per_step, "time_vs_T.png": _time_vs_t, "ratios_vs_T.png": _ratios_vs_t,
           "positions_vs_B.png": _positions_vs_b,
           "heads_vs_T.png": _heads_vs_t, "ragged.png": _ragged, "quantized.png": error_vs_bytes}


def write_plots(run, out_dir, lab=False, protected=()):
    """Draw the figures of ``run`` into ``out_dir`` (created if missing); returns ``[(path, replaced)]``.

    ``lab`` adds the lab's own published figures where it has some, marked as the lab's.
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
        fig = draw(plt, run, title, lab)
        fig.tight_layout()
        target, replaced = targets[name]
        try:
            with paths.atomic_write(target, binary=True) as f:
                fig.savefig(f, format="png", dpi=110)
        finally:
            plt.close(fig)
        written.append((target, replaced))
    return written
