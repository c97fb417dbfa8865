"""The lab's figures for one run, drawn with matplotlib (the optional ``plots`` extra), from the tables' cells.

A paired ratio is drawn with its 95 % interval as error bars; a failed or skipped point leaves a gap. With
``lab=True`` the cache and batch figures also draw the lab's published figures (:mod:`tools.report.lab`) as dashed
grey lines labelled as another machine's; the other figures say the lab published none.
"""

import math
import os

from benchmarks import bench_heads, bench_ragged
from benchmarks.common import STRATEGIES, SWEEP_LENGTH

from .. import paths
from ..common import UserError
from ..results import is_number
from . import lab as lab_figures
from .tables import (CACHE_RATIOS, LAB_CACHE_RATIOS, QUANTIZED_BYTES, QUANTIZED_ERROR, Paired, batch_size_table,
                     batch_table, cache_table, heads_table, ragged_table)

LAB_STYLE = {"linestyle": "--", "marker": "s", "markersize": 4, "alpha": 0.8}
NO_LAB_FIGURES = "the lab published no figures for this experiment"
T_AXIS = "T (tokens decoded)"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError("plots need matplotlib: pip install -e '.[plots]' (tables and csv work without it)") from None
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


def _ratios_vs_t(plt, run, title, lab):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    table = cache_table(run)
    for ax, s in zip(axes, CACHE_RATIOS):
        figure = f"{s} / preallocated"
        cells = _column(table, figure)
        ratio = _errorbar(ax, cells, label="this machine [95 % interval]")
        if lab:
            ax.plot(list(LAB_CACHE_RATIOS[s]), list(LAB_CACHE_RATIOS[s].values()), color="grey", **LAB_STYLE,
                    label=f"{lab_figures.LABEL}: another machine")
        _reference(ax, 1, "1x: equal cost")
        _axes(ax, [t for t, _ in cells], ratio, T_AXIS, f"{figure} (×)", figure, bottom=0,  # small wiggles look small
              legend={"fontsize": 8, "loc": "lower right" if s == "concat" else "upper left"})
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
        cells = _column(table, figure)
        every += _errorbar(axes[0], cells, 1e6, label=label)
    _axes(axes[0], [t for t, _ in cells], every, T_AXIS, "time per decode step (µs), one position of each sequence",
          "per step: the batched step grows several-fold, the saving far less", bottom=0,
          legend={"fontsize": 8, "loc": "upper left"})
    _speedup(axes[1], run, lab)
    fig.suptitle(f"Batch experiment, in pairs — {title}")
    return fig


def _positions_vs_b(plt, run, title, lab):
    cells = _column(batch_size_table(run), "positions / s")
    b, rate = [x for x, _ in cells], [_number(v) for _, v in cells]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(b, rate, marker="o", label="measured")
    if b and b[0] == 1 and math.isfinite(rate[0]):
        ax.plot(b, [rate[0] * x for x in b], linestyle="--", color="grey", label="linear from B = 1")
    _axes(ax, b, rate, "B (sequences per batch)", "positions / s", f"Batched decode at T = {SWEEP_LENGTH}", bottom=0,
          legend={})
    ax.set_xscale("linear")  # so that linear scaling is a straight line
    ax.set_xticks(b, [str(x) for x in b])
    ax.yaxis.set_major_formatter("{x:,.0f}")
    fig.suptitle(f"Positions/s vs B — {title}", fontsize=10)
    return fig


def _heads_vs_t(plt, run, title, lab):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    table = heads_table(run)
    lengths = sorted({t for (_, t), _ in table.rows if is_number(t)})
    every, ratios = [], []
    for kind in dict.fromkeys(kind for (kind, _), _ in table.rows):
        for path, style in (("repeat_kv", "--"), ("grouped", "-")):
            every += _errorbar(axes[0], [(t, c[f"{path} / ms"]) for (k, t), c in table.rows if k == kind], 1e3,
                               linestyle=style, label=f"{kind} ({bench_heads.KINDS.get(kind, '?')} K/V heads), {path}")
        ratios += _errorbar(axes[1], [(t, c["repeat_kv / grouped"]) for (k, t), c in table.rows if k == kind],
                            label=kind)
    _axes(axes[0], lengths, every, T_AXIS, "median decode time (ms)",
          f"B = {bench_heads.HEADS_BATCH}, {bench_heads.HEADS_N_HEADS} query heads", log_y=True, legend={"fontsize": 7})
    _reference(axes[1], 1, "1x: equal cost")
    _axes(axes[1], lengths, ratios, T_AXIS, "repeat_kv / grouped (×)",
          "repeat_kv / grouped\npaired [95 % interval] where measured so, else asv's medians", bottom=0, legend={})
    fig.suptitle(f"Heads: MHA, GQA, MQA decode vs T — {title}")
    return fig


def _ragged(plt, run, title, lab):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    table = ragged_table(run)
    distributions, strategies = [key for (key,), _ in table.rows], STRATEGIES["ragged"]
    width = 0.8 / len(strategies)
    for i, strategy in enumerate(strategies):
        x = [j + (i - (len(strategies) - 1) / 2) * width for j in range(len(distributions))]
        axes[0].bar(x, [_number(cells[f"{strategy} / ms"], 1e3) for _, cells in table.rows], width, label=strategy)
        axes[1].bar(x, [_number(cells.get(f"slots, {strategy}", cells["slots, compacted"]))  # padded: as compacted
                        for _, cells in table.rows], width, label=strategy)
    for ax, ylabel, name in ((axes[0], "median decode time (ms)", "decode time"),
                             (axes[1], "K/V token slots reserved at the peak",
                              f"K/V slots reserved (paged: block_size {bench_ragged.BLOCK_SIZE})")):
        ax.set_xticks(range(len(distributions)), distributions)
        ax.set(xlabel="lengths T_b of the 8 sequences", ylabel=ylabel, title=name)
        ax.grid(True, axis="y", alpha=0.3)
        ax.margins(y=0.2)  # room for the legend above the bars
        ax.legend(loc="upper right", ncol=3, fontsize=8)
    fig.suptitle(f"Ragged batch: padded vs compacted vs paged — {title}")
    return fig


# The quantized cache: beside its points, the bit widths the anchors publish, at the bytes their codes alone take
# per position of the suite's problem (D_k + D_v = 128 elements, 16 bytes a bit; their scales, zeros and residual
# come on top, as ours do in the points): Hugging Face's QuantizedCache (quanto: 2 and 4 bits; HQQ: 1, 2, 3, 4 and
# 8) and KIVI (Liu et al. 2024: 2 and 4 bits), and the float64 cache's 1024 bytes.
ELEMENTS_PER_POSITION = 128
PUBLISHED = {"KIVI": (2, 4), "HF quanto": (2, 4), "HF HQQ": (1, 2, 3, 4, 8)}


def error_vs_bytes(plt, run, title, lab):
    """Max abs error against bytes per position, one point per kind and T of QuantizedAccuracy."""
    measured = {}
    for (benchmark, params), point in run.points.items():
        error = run.value(QUANTIZED_ERROR, **dict(params))
        if benchmark == QUANTIZED_BYTES and is_number(point.value) and is_number(error):
            measured.setdefault(dict(params)["kind"], []).append((dict(params)["T"], point.value, error))
    fig, ax = plt.subplots(figsize=(10, 5))
    markers = dict(zip(sorted({t for rows in measured.values() for t, _, _ in rows}), "osD^v"))  # one per T
    for kind, rows in measured.items():
        rows.sort()
        line, = ax.plot([b for _, b, _ in rows], [e for _, _, e in rows], label=kind)
        for t, b, e in rows:
            ax.plot(b, e, marker=markers[t], color=line.get_color(), linestyle="none")
    for t, marker in markers.items():
        ax.plot([], [], marker=marker, color="grey", linestyle="none", label=f"T = {t} decode steps")
    widths = sorted({b for bits in PUBLISHED.values() for b in bits})
    for x, text, style in [(b * ELEMENTS_PER_POSITION / 8, f"{b} bit{'s' * (b > 1)}: "
                            + ", ".join(name for name, bits in PUBLISHED.items() if b in bits), "--") for b in widths] \
            + [(ELEMENTS_PER_POSITION * 8, "float64 cache, error 0", "-")]:
        ax.axvline(x, color="grey" if style == "--" else "black", linestyle=style, linewidth=0.8)
        ax.text(x, 0.98, f" {text} ", transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="right",
                fontsize=7, color="dimgrey" if style == "--" else "black")
    errors = [e for rows in measured.values() for _, _, e in rows]
    _axes(ax, [16, 32, 64, 128, 256, 512, 1024], errors or [math.nan],
          "bytes per position (K and V, D = 64 each); dashed: published bit widths, their codes alone",
          "max abs error of the attention output", "quantized KV cache, group 32, residual 32",
          log_y=all(e > 0 for e in errors), legend={"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (1.01, 1)})
    fig.suptitle(f"Quantized cache: error vs bytes — {title}")
    return fig


FIGURES = {"batch_per_step.png": _batch_per_step, "ratios_vs_T.png": _ratios_vs_t,
           "positions_vs_B.png": _positions_vs_b, "heads_vs_T.png": _heads_vs_t, "ragged.png": _ragged,
           "quantized.png": error_vs_bytes}
NO_LAB = {"positions_vs_B.png", "heads_vs_T.png", "ragged.png"}  # quantized.png compares with the anchors instead


def write_plots(run, out_dir, lab=False, protected=()):
    """Draw the figures of ``run`` into ``out_dir`` (made if missing); returns ``[(path, replaced)]``.

    Every path is checked as :mod:`tools.paths` says before the first is written (``protected``: folders no file
    may go into), and each PNG is written whole or not at all. UserError: no matplotlib, or a path may not be written.
    """
    plt = _pyplot()
    folder = paths.check_dir(out_dir, protected)
    targets = {name: paths.check_file(os.path.join(folder, name), protected, what=os.path.join(out_dir, name))
               for name in FIGURES}
    written = []
    for name, draw in FIGURES.items():
        fig = draw(plt, run, f"commit {run.commit[:8]} on {run.machine}", lab)
        if lab and name in NO_LAB:
            fig.text(0.01, 0.01, NO_LAB_FIGURES, fontsize=8, color="grey")
        fig.tight_layout()
        try:
            with paths.atomic_write(targets[name][0], binary=True) as f:
                fig.savefig(f, format="png", dpi=110)
        finally:
            plt.close(fig)
        written.append(targets[name])
    return written


def _model(plt, run, title, lab):
    """The model experiment: ms per token vs T per cache kind; a step's bytes vs B x T, weights against K/V, with
    each model's crossover; positions/s vs B with linear scaling from B = 1 (all from the tables' cells)."""
    from .tables import MODEL_BYTES, model_batch_table, model_bytes, model_table

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    table, every = model_table(run), []
    for cache in dict.fromkeys(c for (_, c), _ in table.rows):
        every += _errorbar(axes[0], [(t, cells["ms / token"]) for (t, c), cells in table.rows if c == cache], 1e3,
                           label=f"{cache} cache")
    _axes(axes[0], sorted({t for (t, _), _ in table.rows if is_number(t)}), every, "T (positions in each cache)",
          "ms per token, B = 1", "one decode step, float32", bottom=0)
    positions = [2 ** k for k in range(8, 21)]  # B x T
    for (model, marker), color in zip((("SmolLM-135M", "o"), ("Llama-3-8B", "s")), ("C0", "C3")):
        weights, per_token, crossover = model_bytes(run, model)
        if not all(is_number(v) for v in (weights, per_token, crossover)):
            continue
        axes[1].plot(positions, [weights] * len(positions), color=color, label=f"{model}: weights")
        axes[1].plot(positions, [per_token * n for n in positions], color=color, linestyle="--", label="its K/V")
        axes[1].plot([crossover], [weights], marker=marker, color=color, linestyle="none",
                     label=f"equal at B x T = {crossover:,.0f}")
    _axes(axes[1], [], [math.nan] if not axes[1].lines else [1.0], "B x T (cached positions in the batch)",
          "bytes a step reads", "weights vs K/V cache (SmolLM float32, Llama bf16)", log_y=True,
          legend={"fontsize": 7})
    cells = [(b, c["positions / s"]) for (b,), c in model_batch_table(run).rows]
    one = [c["B = 1, same pairs"] for _, c in model_batch_table(run).rows if is_number(c["B = 1, same pairs"])]
    if one:
        cells = [(1, sum(one) / len(one))] + cells
    rate = _errorbar(axes[2], cells, label="measured (B = 1: its mean over the pairs)")
    if one:
        axes[2].plot([b for b, _ in cells], [b * cells[0][1] for b, _ in cells], linestyle="--", color="grey",
                     label="linear from B = 1: weights read once a step")
    _axes(axes[2], [b for b, _ in cells], rate, "B (sequences per step)", "positions / s",
          "batched steps, static caches, T = 256", bottom=0, legend={"fontsize": 8})
    axes[2].set_xscale("linear")  # so that linear scaling is a straight line
    fig.suptitle(f"Model experiment, SmolLM-135M's shape — {title}")
    return fig


FIGURES["model.png"] = _model
NO_LAB.add("model.png")
