"""The lab's figures for one run, drawn with matplotlib from the tables' cells: a paired ratio with its 95 % interval
as error bars, a failed or skipped point a gap; ``lab=True`` adds the lab's published figures as dashed grey lines.
"""

import math
import os

from .. import paths
from ..results import is_number
from . import lab as lab_figures
from .tables import Paired, batch_table

LAB_STYLE = {"linestyle": "--", "marker": "s", "markersize": 4, "alpha": 0.8}
T_AXIS = "T (tokens decoded)"


def _pyplot():
    import matplotlib  # in .venv: the test extra's

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _number(v, scale=1.0):
    return v * scale if is_number(v) else math.nan


def _errorbar(ax, cells, scale=1.0, **style):
    """``cells`` ``[(x, cell)]`` as a line with error bars: a Paired's 95 % interval, else none; y values drawn."""
    y = [_number(c, scale) for _, c in cells]
    err = [[max(0.0, (c - c.low) * scale) if isinstance(c, Paired) and c.low is not None else 0.0 for _, c in cells],
           [max(0.0, (c.high - c) * scale) if isinstance(c, Paired) and c.high is not None else 0.0 for _, c in cells]]
    ax.errorbar([x for x, _ in cells], y, yerr=err, marker="o", capsize=3, **style)
    return y


def _column(table, figure):
    """``[(key, cell)]`` of a table's column, for the rows keyed by one number."""
    return [(key, cells[figure]) for (key, *_), cells in table.rows if is_number(key)]


def _axes(ax, keys, values, xlabel, ylabel, title, log_y=False, bottom=None, legend=None):
    """A base-2 x axis labelled with the measured values, the y scale, labels, grid and legend."""
    ax.set_xscale("log", base=2)
    if keys:
        ax.set_xticks(keys, [str(t) for t in keys])
        ax.minorticks_off()
    if not any(math.isfinite(v) for v in values):
        ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
    elif log_y:
        ax.set_yscale("log")
    if bottom is not None:
        ax.set_ylim(bottom=bottom)
    ax.grid(True, which="both", alpha=0.3)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**({"fontsize": 8} if legend is None else legend))


def _reference(ax, y, label, linestyle=":"):
    ax.axhline(y, color="black", linewidth=0.8, linestyle=linestyle, label=label)


def _speedup(ax, run, lab):
    """The batch speedup with its 95 % interval vs T, the lab's published one beside it, 1x and 2x marked."""
    cells = _column(batch_table(run), "speedup")
    speedup = _errorbar(ax, cells, label="this machine [95 % interval]")
    if lab:
        ax.plot(list(lab_figures.BATCH_SPEEDUP), list(lab_figures.BATCH_SPEEDUP.values()), color="grey",
                **LAB_STYLE, label=f"{lab_figures.LABEL}: another machine")
    _reference(ax, 2, "2x: the most B = 2 can save", "-.")
    _reference(ax, 1, "1x: no saving")
    _axes(ax, [t for t, _ in cells], speedup, T_AXIS, "speedup: sequential / batched (×)", "batched speedup, B = 2",
          legend={"fontsize": 8, "loc": "lower left"})
    ax.set_ylim(0, 2.2)


def _batch_per_step(plt, run, title, lab):
    """Why the speedup shrinks: per step, the saving stays while the batched step grows (both from the pairs)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    table = batch_table(run)
    every = []
    for figure, label in (("sequential / step, µs", "sequential, per step"),
                          ("batched / step, µs", "batched, per step"),
                          ("saved / step, µs", "saved by batching, per step [95 % interval]")):
        cells = _column(table, figure)
        every += _errorbar(axes[0], cells, 1e6, label=label)
    _axes(axes[0], [t for t, _ in cells], every, T_AXIS, "time per decode step (µs), one position of each sequence",
          "per step: the batched step grows several-fold, the saving far less", bottom=0,
          legend={"fontsize": 8, "loc": "upper left"})
    _speedup(axes[1], run, lab)
    fig.suptitle(f"Batch experiment, in pairs — {title}")
    return fig


def write_plots(run, out_dir, figures=None, lab=False):
    """Draw ``figures`` (default: all) of ``run`` into ``out_dir``, every path checked (:mod:`tools.paths`) before the
    first is written; yields ``(path, replaced)``."""
    plt = _pyplot()
    folder = paths.check_dir(out_dir)
    targets = {name: paths.check_file(os.path.join(folder, name), what=os.path.join(out_dir, name))
               for name in FIGURES if not figures or name.removesuffix(".png") in figures}
    for name in targets:
        replaced = os.path.exists(targets[name])
        machine = run.machine.encode(errors="surrogateescape").decode(errors="backslashreplace")  # a folder's bytes
        fig = FIGURES[name](plt, run, f"commit {run.commit[:8]} on {machine}", lab)
        fig.tight_layout()
        try:
            with paths.atomic_write(targets[name], binary=True) as f:
                fig.savefig(f, format="png", dpi=110)
        finally:
            plt.close(fig)
        yield targets[name], replaced


def _as_rate(cells):
    """A batch row's positions/s with the interval of its paired ratio over B = 1, scaled to positions/s."""
    rate, ratio = cells["positions / s"], cells["over B = 1"]
    if not (is_number(rate) and isinstance(ratio, Paired) and ratio.low is not None and ratio):
        return rate
    return Paired(rate, rate * ratio.low / ratio, rate * ratio.high / ratio)


def _model(plt, run, title, lab):
    """The model experiment: ms per token vs T per cache kind; a step's bytes vs B x T, weights against K/V, with
    each model's crossover; positions/s vs B with linear scaling from B = 1 (all from the tables' cells)."""
    from .tables import model_batch_table, model_bytes, model_table

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    table, every = model_table(run), []
    for cache in dict.fromkeys(c for (_, c), _ in table.rows):
        every += _errorbar(axes[0], [(t, cells["ms / token"]) for (t, c), cells in table.rows if c == cache], 1e3,
                           label=f"{cache} cache")
    _axes(axes[0], sorted({t for (t, _), _ in table.rows if is_number(t)}), every, "T (positions in each cache)",
          "ms per token, B = 1", "one decode step, float32", bottom=0)
    positions = [2 ** k for k in range(8, 21)]  # B x T
    for (model, marker), color in zip((("SmolLM-135M", "o"), ("Llama-3-8B", "s")), ("C0", "C3")):
        weights, per_token, crossover = model_bytes(model)
        if not all(is_number(v) for v in (weights, per_token, crossover)):
            continue
        axes[1].plot(positions, [weights] * len(positions), color=color, label=f"{model}: weights")
        axes[1].plot(positions, [per_token * n for n in positions], color=color, linestyle="--", label="its K/V")
        axes[1].plot([crossover], [weights], marker=marker, color=color, linestyle="none",
                     label=f"equal at B x T = {crossover:,.0f}")
    _axes(axes[1], [], [math.nan] if not axes[1].lines else [1.0], "B x T (cached positions in the batch)",
          "bytes a step reads", "weights vs K/V cache (SmolLM float32, Llama bf16)", log_y=True,
          legend={"fontsize": 7})
    batch, rate = model_batch_table(run), []
    for t, color in zip(dict.fromkeys(t for (t, _), _ in batch.rows), ("C0", "C1", "C2")):
        rows = [(b, c) for (t_row, b), c in batch.rows if t_row == t]
        one = [c["B = 1, same pairs"] for _, c in rows if is_number(c["B = 1, same pairs"])]
        cells = [(b, _as_rate(c)) for b, c in rows]
        if one:
            cells = [(1, sum(one) / len(one))] + cells
        rate += _errorbar(axes[2], cells, color=color, label=f"T = {t} (B = 1: its mean over the pairs)")
        if one:
            axes[2].plot([b for b, _ in cells], [b * cells[0][1] for b, _ in cells], linestyle="--", color=color,
                         alpha=0.6, label="linear from B = 1: weights read once a step" if color == "C0" else None)
    _axes(axes[2], sorted({1, *(b for (_, b), _ in batch.rows)}), rate, "B (sequences per step)", "positions / s",
          "batched steps, static caches [95 % interval]", bottom=0, legend={"fontsize": 7})
    axes[2].set_xscale("linear")  # so that linear scaling is a straight line
    fig.suptitle(f"Model experiment, SmolLM-135M's shape — {title}")
    return fig


FIGURES = {"batch_per_step.png": _batch_per_step, "model.png": _model}
