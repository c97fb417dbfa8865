"""The lab's tables and those of the experiments beyond it, from one run's stored results, as Markdown.

A cell holds seconds, a ratio, a rate or a count, or a marker (``failed``, ``n/a``) that a figure derived from it
carries on. A ratio column holds the suite's paired ratio where the run has one (``benchmarks/ratios.py``), shown
with its 95 % interval, ``1.73x [1.71, 1.75]``; else the ratio of asv's two medians, ``1.73x (unpaired)``.
"""

import itertools
import inspect
from dataclasses import dataclass

from benchmarks import (bench_batch, bench_heads, bench_model, bench_quantized, bench_ragged, bench_roofline,
                        bench_speculative)
from benchmarks.common import BATCH, LENGTHS, STRATEGIES, SWEEP_BATCH_SIZES, SWEEP_LENGTH, verified_decode

from ..common import UserError
from ..results import FAILED, SKIPPED, is_number
from . import EXPERIMENTS, lab

(CACHE_PAIRED, BATCH_PAIRED, SWEEP_BENCHMARK, HEADS_BENCHMARK, RAGGED_BENCHMARK, ROOFLINE_PAIRED,
 QUANTIZED_BENCHMARK, *_) = EXPERIMENTS.values()  # a paired ratio's interval: + "_low", + "_high"
CACHE_BENCHMARK = "bench_cache.CacheStrategy.time_decode"  # asv's timings, where no paired ratio was stored
BATCH_BENCHMARK = "bench_batch.BatchStrategy.time_decode"
QUANTIZED_BYTES = "bench_quantized.QuantizedAccuracy.track_bytes_per_position"
QUANTIZED_ERROR = "bench_quantized.QuantizedAccuracy.track_max_abs_error"
QUANTIZED_PAIRED = "bench_quantized.QuantizedRatios.track_ratio"  # the decode over a DynamicCache's
FUSED_PAIRED = "bench_quantized.FusedRatios.track_ratio"  # one step from the codes over dequantize-then-attend
ROOFLINE_RATES = {"step GB/s": "bench_roofline.Roofline.track_step_gbps",
                  "read GB/s": "bench_roofline.Roofline.track_read_gbps"}
HEADS_PEAK = "bench_heads.HeadsDecode.track_decode_peak_bytes"
HEADS_CACHE = "bench_heads.HeadsCacheBytes.track_kv_cache_bytes"
RAGGED_SLOTS = "bench_ragged.RaggedDecode.track_reserved_slots"
RAGGED_ROWS = "bench_ragged.RaggedDecode.track_row_steps"
SWEEP_PAIRED = "bench_batch.BatchSizeRatios.track_ratio"
HEADS_PAIRED = "bench_heads.HeadsRatios.track_ratio"
RAGGED_PAIRED = "bench_ragged.RaggedRatios.track_ratio"
PAGED_STEP_PAIRED = "bench_ragged.PagedStepRatios.track_ratio"
CHECK_RTOL, CHECK_ATOL = (inspect.signature(verified_decode).parameters[k].default for k in ("rtol", "atol"))
BATCH_STEP = "bench_batch.BatchRatios.track_"  # + sequential_step, batched_step, saved_step (+ _low, _high)
LAB_NOTE = f"lab's: published by the lab, on another machine ({lab.MACHINE}); n/a: none published."
PAIRED_NOTE = ("Ratios: the median of per-pair ratios, the two sides timed in turns in one process [its 95 % "
               "interval]. A ratio marked (unpaired) is one of asv's medians, from separate processes.")
CACHE_RATIOS = ("no_cache", "concat")  # each over preallocated: what recomputing, and what concatenating, costs
LAB_CACHE_RATIOS = {s: {t: ms[s] / ms["preallocated"] for t, ms in lab.CACHE_MS.items()} for s in CACHE_RATIOS}
RAGGED_RATIOS = ("padded", "compacted")  # each over paged
UTC = "%Y-%m-%d %H:%M UTC"


class Paired(float):
    """A paired ratio (``track_ratio``): the median of per-pair ratios, its 95 % interval ``low``, ``high``."""

    def __new__(cls, median, low=None, high=None):
        ratio = super().__new__(cls, median)
        ratio.low, ratio.high = low, high
        return ratio


class Unpaired(float):
    """A ratio of two of asv's medians, measured in separate processes: the fallback where no paired one exists."""


def paired(run, benchmark, unpaired, **params):
    """The paired ratio ``benchmark`` at ``params`` if ``run`` has it, else ``unpaired`` (two medians' ratio) marked
    :class:`Unpaired`. A failed paired ratio stays ``failed``: its correctness check is the timings' own."""
    value = run.value(benchmark, **params)
    if is_number(value):
        low, high = (run.value(benchmark + end, **params) for end in ("_low", "_high"))
        return Paired(value, *((low, high) if is_number(low) and is_number(high) else (None, None)))
    if value == FAILED:
        return FAILED
    return Unpaired(unpaired) if is_number(unpaired) else unpaired


@dataclass(frozen=True)
class Table:
    """A table of one run: ``rows`` are ``(key tuple, {figure: cell})``; ``kinds`` maps figure -> format."""

    title: str
    keys: tuple  # headers of the key columns: ("T",), ("kind", "T"), ...
    kinds: dict  # figure -> a key of FORMATS
    rows: list
    note: str = ""


def _combine(op, *cells):
    """``op(*cells)`` if every cell is a number, else the marker (failed wins over n/a)."""
    if all(is_number(c) for c in cells):
        try:
            return op(*cells)
        except ZeroDivisionError:
            return SKIPPED
    return FAILED if FAILED in cells else SKIPPED


def _keys(run, benchmark, name, default):
    """The values of parameter ``name`` the run measured, in the suite's order (``default``), else ``default``."""
    default = list(default)
    found = {dict(key[1]).get(name) for key in run.points if key[0] == benchmark} - {None}
    odd = sorted(str(v) for v in found if not is_number(v)) if all(is_number(v) for v in default) else []
    if odd:  # a table computes with these (positions / s = B x T / time): never with text
        raise UserError(f"results of {benchmark} at {run.commit[:8]} hold {name} = {odd[0][:60]}, "
                        "not a number in range")
    order = {v: i for i, v in enumerate(default)}
    rank = {v: (order.get(v, len(order)), *((0, v) if is_number(v) else (1, str(v)))) for v in found}
    return sorted(found, key=rank.get) or default


def cache_table(run):
    """Cache experiment: one sequence ``[T, 64]``: no_cache and concat over preallocated, paired, beside the lab's."""
    rows = []
    for t in _keys(run, CACHE_BENCHMARK, "T", LENGTHS):
        ms = {s: run.value(CACHE_BENCHMARK, T=t, strategy=s) for s in STRATEGIES["cache"]}
        cells = {"equal to full attention": _combine(lambda *_: "yes, all 3", *ms.values())}
        for s in CACHE_RATIOS:
            unpaired = _combine(lambda a, b: a / b, ms[s], ms["preallocated"])
            cells[f"{s} / preallocated"] = paired(run, CACHE_PAIRED, unpaired, T=t, strategy=s)
            cells[f"lab's {s} / preallocated"] = LAB_CACHE_RATIOS[s].get(t, SKIPPED)
        rows.append(((t,), cells))
    kinds = {"equal to full attention": "text"} | {f"{s} / preallocated": "ratio" for s in CACHE_RATIOS} | {
        f"lab's {s} / preallocated": "ratio" for s in CACHE_RATIOS}
    note = (f"equal to full attention: all three outputs within rtol {CHECK_RTOL:g}, atol {CHECK_ATOL:g} of an "
            "independent full attention, checked before timing. " + PAIRED_NOTE + " " + LAB_NOTE
            + " Absolute times: `report csv` and the dashboard.")
    return Table("Cache experiment: full decode of one sequence", ("T",), kinds, rows, note)


def batch_table(run, batch=BATCH):
    """Batch experiment: B sequences ``[B, T, 64]`` decoded one after another vs as one batch, paired."""
    rows = []
    for t in _keys(run, BATCH_PAIRED, "T", sorted({*LENGTHS, *bench_batch.RATIO_LENGTHS})):
        unpaired = _combine(lambda a, b: a / b, *(run.value(BATCH_BENCHMARK, T=t, strategy=s)
                                                   for s in STRATEGIES["batch"]))
        step = {side: run.value(f"{BATCH_STEP}{side}_step", T=t) for side in ("sequential", "batched", "saved")}
        rows.append(((t,), {
            "speedup": paired(run, BATCH_PAIRED, unpaired, T=t),
            "lab's speedup": lab.BATCH_SPEEDUP.get(t, SKIPPED),
            "sequential / step, µs": step["sequential"],
            "batched / step, µs": step["batched"],
            "saved / step, µs": paired(run, BATCH_STEP + "saved_step", step["saved"], T=t),
            "positions / s": _combine(lambda b: batch / b, step["batched"]),
        }))
    kinds = {"speedup": "ratio3", "lab's speedup": "ratio3", "sequential / step, µs": "us",
             "batched / step, µs": "us", "saved / step, µs": "us", "positions / s": "rate"}
    note = (f"A step decodes one position of each of the B = {batch} sequences. The step columns are medians over "
            "the speedup's own pairs: each side's time / T, and the saving (sequential - batched) / T [its 95 % "
            "interval]. So speedup = 1 + saved / batched, up to their noise. Positions / s = B / batched step. "
            + PAIRED_NOTE + " " + LAB_NOTE)
    return Table(f"Batch experiment: B = {batch} sequences, sequential vs batched, in pairs", ("T",), kinds, rows,
                 note)


def batch_size_table(run, t_len=SWEEP_LENGTH):
    """Batch-size sweep at T = 128: batched ms, ms per sequence, positions/s, scaling vs B = 1."""
    sizes = _keys(run, SWEEP_BENCHMARK, "B", SWEEP_BATCH_SIZES)
    rate = {b: _combine(lambda s: b * t_len / s, run.value(SWEEP_BENCHMARK, B=b)) for b in sizes}
    rows = []
    for b in sizes:
        bat = run.value(SWEEP_BENCHMARK, B=b)
        rows.append(((b,), {
            "batched / ms": bat,
            "ms per sequence": _combine(lambda s: s / b, bat),
            "positions / s": rate[b],
            "scaling vs B = 1": (_combine(lambda r: 1.0, rate[b]) if b == 1 else  # B = 1 over itself: 1
                                 paired(run, SWEEP_PAIRED, _combine(lambda r, r1: r / r1, rate[b],
                                                                    rate.get(1, SKIPPED)), B=b)),
        }))
    kinds = {"batched / ms": "ms", "ms per sequence": "ms", "positions / s": "rate", "scaling vs B = 1": "ratio3"}
    note = (f"positions / s = B x {t_len} / batched time; scaling = positions / s over that of B = 1, "
            f"B x time at B = 1 / time at B. " + PAIRED_NOTE)
    return Table(f"Batch size: batched decode at T = {t_len}", ("B",), kinds, rows, note)


def heads_table(run):
    """Heads experiment: repeat_kv vs grouped decode per kind and T, with the bytes each allocated."""
    rows = []
    for kind in _keys(run, HEADS_BENCHMARK, "kind", bench_heads.KINDS):
        for t in _keys(run, HEADS_BENCHMARK, "T", bench_heads.HEADS_LENGTHS):
            rep = run.value(HEADS_BENCHMARK, kind=kind, T=t, path="repeat_kv")
            grp = run.value(HEADS_BENCHMARK, kind=kind, T=t, path="grouped")
            rows.append(((kind, t), {
                "repeat_kv / ms": rep,
                "grouped / ms": grp,
                "repeat_kv / grouped": paired(run, HEADS_PAIRED, _combine(lambda a, b: a / b, rep, grp),
                                              kind=kind, T=t),
                "peak bytes, repeat_kv": run.value(HEADS_PEAK, kind=kind, T=t, path="repeat_kv"),
                "peak bytes, grouped": run.value(HEADS_PEAK, kind=kind, T=t, path="grouped"),
                "KV cache bytes": run.value(HEADS_CACHE, kind=kind, T=t),
            }))
    kinds = {"repeat_kv / ms": "ms", "grouped / ms": "ms", "repeat_kv / grouped": "ratio3",
             "peak bytes, repeat_kv": "bytes", "peak bytes, grouped": "bytes", "KV cache bytes": "bytes"}
    note = (f"B = {bench_heads.HEADS_BATCH}, {bench_heads.HEADS_N_HEADS} query heads of D_head = "
            f"{bench_heads.HEADS_HEAD_DIM}, K/V heads: " + ", ".join(f"{k} {n}" for k, n in bench_heads.KINDS.items())
            + "; peak bytes are allocated during one decode (tracemalloc); 1 MiB = 2^20 bytes. "
            + f"Paired at T = {bench_heads.RATIO_LENGTH} only. " + PAIRED_NOTE)
    return Table("Heads experiment: MHA, GQA and MQA decode, repeat_kv vs grouped", ("kind", "T"), kinds, rows, note)


def ragged_table(run):
    """Ragged experiment: padded vs compacted vs paged decode per length distribution, with their counts."""
    rows = []
    for lengths in _keys(run, RAGGED_BENCHMARK, "lengths", bench_ragged.LENGTH_DISTRIBUTIONS):
        ms = {s: run.value(RAGGED_BENCHMARK, strategy=s, lengths=lengths) for s in STRATEGIES["ragged"]}
        rows.append(((lengths,), {
            **{f"{s} / ms": v for s, v in ms.items()},
            **{f"{s} / paged": paired(run, RAGGED_PAIRED, _combine(lambda a, b: a / b, ms[s], ms["paged"]),
                                      strategy=s, lengths=lengths) for s in RAGGED_RATIOS},
            "rows, padded": run.value(RAGGED_ROWS, strategy="padded", lengths=lengths),
            "rows, compacted": run.value(RAGGED_ROWS, strategy="compacted", lengths=lengths),
            "slots, compacted": run.value(RAGGED_SLOTS, strategy="compacted", lengths=lengths),
            "slots, paged": run.value(RAGGED_SLOTS, strategy="paged", lengths=lengths),
        }))
    kinds = ({f"{s} / ms": "ms" for s in STRATEGIES["ragged"]}
             | {f"{s} / paged": "ratio" for s in RAGGED_RATIOS}
             | dict.fromkeys(("rows, padded", "rows, compacted", "slots, compacted", "slots, paged"), "count"))
    note = (f"B = {bench_ragged.RAGGED_BATCH} sequences, T_b: " + "; ".join(
        f"{name} {', '.join(map(str, lens))}" for name, lens in bench_ragged.LENGTH_DISTRIBUTIONS.items())
            + f"; block_size {bench_ragged.BLOCK_SIZE}. rows: query rows computed over the decode; "
            "slots: K/V token slots reserved at the peak (padded reserves as many as compacted). " + PAIRED_NOTE)
    return Table("Ragged experiment: padded vs compacted (dynamic exit) vs paged KV cache", ("lengths",), kinds,
                 rows, note)


def roofline_table(run):
    """Roofline experiment: one decode step at model shapes, as a fraction of the read bandwidth in its process."""
    rows = []
    keys = ("shape", "T", "B", "path")
    for key in itertools.product(*(_keys(run, ROOFLINE_PAIRED, name, getattr(bench_roofline, f"ROOFLINE_{plural}"))
                                   for name, plural in zip(keys, ("SHAPES", "LENGTHS", "BATCHES", "PATHS")))):
        point = dict(zip(keys, key))
        nbytes = bench_roofline.step_bytes(*key)  # arithmetic, the same at every commit
        rates = {label: run.value(name, **point) for label, name in ROOFLINE_RATES.items()}
        rows.append((key, {
            "bytes / step": nbytes,
            "fraction of read bandwidth": paired(run, ROOFLINE_PAIRED, SKIPPED, **point),
            **rates,
            "step / ms": _combine(lambda n, r: n / r / 1e9, nbytes, rates["step GB/s"]),
        }))
    kinds = {"bytes / step": "bytes", "fraction of read bandwidth": "fraction", "step GB/s": "gbps",
             "read GB/s": "gbps", "step / ms": "ms"}
    note = ("One decode step (one new token per sequence) through the public multi_head_decode, with its default "
            "checks, and a float32 StaticCache holding T positions. bytes / step: the layer's four projection "
            "weights, K and V of the T + 1 positions, and for repeat_kv with G > 1 its copies of K and V for every "
            "query head. fraction: the median of per-pair (read time / step time), the step timed in turns with a "
            "kernel reading the same bytes once (np.vdot of each buffer with itself; np.sum before version 2), in one "
            "process [its 95 % interval]; GB/s: the bytes over each "
            "side's median sample (10^9 bytes / s). n/a: not measured, over the 2 GiB memory budget, B = 4 "
            "beyond T = 1024 (the time budget), or repeat_kv at G = 1 (the grouped step). 1 MiB = 2^20 bytes.")
    return Table("Roofline experiment: one decode step at model shapes, as a fraction of the read bandwidth",
                 keys, kinds, rows, note)


def quantized_table(run):
    """Quantized cache: per kind, bytes per position and error (exact), the decode's time and paired ratios."""
    rows = []
    t_len = max(bench_quantized.LENGTHS)
    for kind in _keys(run, QUANTIZED_BYTES, "kind", list(bench_quantized.KINDS)):
        point = {"T": t_len, "kind": kind}
        rows.append(((kind,), {
            "bytes / position": run.value(QUANTIZED_BYTES, **point),
            "max abs error": run.value(QUANTIZED_ERROR, **point),
            "decode / ms": run.value(QUANTIZED_BENCHMARK, **point),
            "decode / DynamicCache": paired(run, QUANTIZED_PAIRED, SKIPPED, **point),
            **{f"from the codes, T = {t}": paired(run, FUSED_PAIRED, SKIPPED, T=t, kind=kind)
               for t in bench_quantized.STEP_LENGTHS},
        }))
    kinds = {"bytes / position": "count", "max abs error": "error", "decode / ms": "ms",
             "decode / DynamicCache": "ratio",
             **{f"from the codes, T = {t}": "ratio" for t in bench_quantized.STEP_LENGTHS}}
    note = (f"A {t_len}-step decode of the suite's problem (float64, D = 64; a float64 cache holds 1024 bytes a "
            "position) through a QuantizedCache of group 32 and residual 32: its bytes per position and the max abs "
            "error of the output against exact attention (exact figures), its time, and its paired ratio over a "
            "DynamicCache decode. from the codes: one attention step over a cache of T positions, scores and output "
            "read from the codes, over dequantize-then-attend. " + PAIRED_NOTE)
    return Table(f"Quantized KV cache at T = {t_len}", ("kind",), kinds, rows, note)


# Beyond the lab: experiment -> (where it is explained, [(what, benchmark, params, kind)]), one line each.
RESULTS_PAGE = "docs/results.md"
BEYOND = {
    "heads: GQA": ("#heads", [("repeat_kv / grouped decode, 8 query over 2 K/V heads, T = 64", HEADS_PAIRED,
                               {"kind": "gqa", "T": bench_heads.RATIO_LENGTH}, "ratio")]),
    "ragged batch, paged cache": ("#ragged", [
        ("step, 8,192 + 7 × 64, padded / paged", PAGED_STEP_PAIRED, {"point": "padded_8192"}, "ratio"),
        ("2,048 + 7 × 64, gather / paged", PAGED_STEP_PAIRED, {"point": "gather_2048"}, "ratio")]),
    "chunked prefill": ("#prefill", [("chunks of 64 / one-shot, T = 512", "bench_prefill.PrefillRatios.track_ratio",
                                      {"chunk_size": 64}, "ratio")]),
    "sliding window": ("#prefill", [
        ("K/V bytes held at T = 1024, W = 64", "bench_prefill.WindowCacheBytes.track_kv_cache_bytes",
         {"window": "64", "T": 1024}, "count"),
        ("full cache", "bench_prefill.WindowCacheBytes.track_kv_cache_bytes", {"window": "none", "T": 1024}, "count")]),
    "serving, prefix caching": ("#serving", [
        ("peak blocks, caching on", "bench_serve.ServeCounts.track_peak_blocks",
         {"prefix_caching": "on", "pool": "ample"}, "count"),
        ("off", "bench_serve.ServeCounts.track_peak_blocks", {"prefix_caching": "off", "pool": "ample"}, "count"),
        ("tokens read from the prefix cache", "bench_serve.ServeCounts.track_prefix_hit_tokens",
         {"prefix_caching": "on", "pool": "ample"}, "count")]),
    "split-KV": ("#split", [("16 splits / unsplit, one step at T = 2048", "bench_split.SplitRatios.track_ratio",
                             {"num_splits": 16}, "ratio")]),
    "cascade attention": ("#split", [
        ("key bytes read, cascade", "bench_split.CascadeAttention.track_key_bytes_read", {"strategy": "cascade"},
         "count"),
        ("each its own copy", "bench_split.CascadeAttention.track_key_bytes_read", {"strategy": "concatenated"},
         "count")]),
    "roofline": ("#roofline", [("fraction of the read rate, Llama-2-7B, T = 16384, one step", ROOFLINE_PAIRED,
                                {"shape": "Llama-2-7B", "T": 16384, "B": 1, "path": "grouped"}, "fraction"),
                               ("Llama-3-8B", ROOFLINE_PAIRED,
                                {"shape": "Llama-3-8B", "T": 16384, "B": 1, "path": "grouped"}, "fraction")]),
    "quantized cache": ("#quantized", [
        ("int4 bytes / position (float64: 1024)", QUANTIZED_BYTES, {"kind": "int4", "T": 128}, "count"),
        ("max abs error", QUANTIZED_ERROR, {"kind": "int4", "T": 128}, "error")]),
}


def beyond_table(run):
    """Beyond the lab: one headline per experiment, each figure paired (with its interval) or exact."""
    rows = []
    for experiment, (anchor, parts) in BEYOND.items():
        cells = [(what, paired(run, benchmark, run.value(benchmark, **params), **params), kind)
                 for what, benchmark, params, kind in parts]
        text = "; ".join(f"{what}: {format_cell(value, kind)}" for what, value, kind in cells)
        rows.append(((experiment,), {"headline": text, "explained in": f"[{anchor[1:]}](/{RESULTS_PAGE}{anchor})"}))
    note = (f"explained in: a section of {RESULTS_PAGE}. A / B is A's time over B's (above 1: B is faster), "
            "paired [95 % interval]; counts are exact.")
    return Table("Beyond the lab", ("experiment",), {"headline": "text", "explained in": "text"}, rows, note)


TABLES = {"cache": cache_table, "batch": batch_table, "batch_size": batch_size_table, "heads": heads_table,
          "ragged": ragged_table, "roofline": roofline_table,
          "quantized": quantized_table, "beyond": beyond_table}  # one per experiment of EXPERIMENTS, in its order
# Tables shown by default only where the run measured their benchmark (the last in TABLES): no page of n/a.
OPTIONAL = {"roofline": ROOFLINE_PAIRED, "quantized": QUANTIZED_BYTES, "beyond": ROOFLINE_PAIRED}


def all_tables(run, experiments=None):
    """The tables of ``run``: every one (an :data:`OPTIONAL` one only where the run measured it), or those of
    ``experiments`` (keys of :data:`TABLES`), in that order."""
    measured = {key[0] for key in run.points}
    default = [name for name in TABLES if name not in OPTIONAL or OPTIONAL[name] in measured]
    return [TABLES[name](run) for name in (experiments or default)]


FORMATS = {  # cell kind -> text of a number (seconds, ratio, rate, bytes or count)
    "ms": lambda v: f"{v * 1e3:.3f}",
    "us": lambda v: f"{v * 1e6:.1f}",
    "ratio": lambda v: f"{v:.2f}x",
    "ratio3": lambda v: f"{v:.3f}x",
    "rate": lambda v: f"{v:,.0f}",
    "count": lambda v: f"{v:,.0f}",
    "bytes": lambda v: f"{v / 2**20:,.2f} MiB",
    "fraction": lambda v: f"{100 * v:.1f}%",  # its interval reads [34.1, 37.5]
    "gbps": lambda v: f"{v:.2f}",
    "error": lambda v: f"{v:.2g}",
    "number": lambda v: f"{v:.3f}",
    "text": str,
}


def format_cell(value, kind):
    """A cell as text (markers as they are): ``16.18x [16.02, 16.31]`` for a Paired, ``16.18x (unpaired)``."""
    if not is_number(value):
        return str(value)
    text = FORMATS[kind](value)
    if isinstance(value, Paired) and value.low is not None:  # the interval's ends without their unit (x, %)
        return f"{text} [{FORMATS[kind](value.low).rstrip('x%')}, {FORMATS[kind](value.high).rstrip('x%')}]"
    return f"{text} (unpaired)" if isinstance(value, Unpaired) else text


def render_table(table):
    """One table as Markdown: a heading, a pipe table (text columns left-aligned, the rest right), and its note."""
    from tabulate import tabulate  # asv's own dependency

    rows = [[*map(str, key), *(format_cell(cells[f], k) for f, k in table.kinds.items())] for key, cells in table.rows]
    align = ["left" if table.kinds.get(h) == "text" else "right" for h in [*table.keys, *table.kinds]]
    text = tabulate(rows, headers=[*table.keys, *table.kinds], tablefmt="pipe", colalign=align, disable_numparse=True)
    return "\n".join([f"### {table.title}", "", text] + (["", table.note] if table.note else []))


def describe(run, experiments=None):
    """Lines naming the commit, machine and environment of a run, and the samples per point of the timings the
    tables of ``experiments`` show (default: every table)."""
    p = run.machine_params
    ram = f", {int(p['ram']) / 2**30:.1f} GiB RAM" if p.get("ram", "").isdecimal() else ""
    machine = ", ".join(str(p[k]) for k in ("cpu", "arch", "os") if p.get(k))
    cpus = f", {p['num_cpu']} CPUs" if p.get("num_cpu") else ""
    shown = {EXPERIMENTS[name] for name in (experiments or TABLES)}
    samples = sorted({pt.stats.get("repeat") for pt in run.points.values()
                      if pt.benchmark in shown and pt.stats.get("repeat")})
    counts = f"{samples[0]:g}" if len(samples) == 1 else f"{samples[0]:g}–{samples[-1]:g}" if samples else "?"
    measured = (", measured " + run.measured.strftime(UTC)) if run.measured else ""
    timed = any(name.rsplit(".", 1)[-1].startswith("time_") for name in shown)  # roofline's is a tracked value
    return [
        f"- commit `{run.commit[:8]}` (commit date {run.date.strftime(UTC)}{measured})",
        f"- machine `{run.machine}`: {machine}{cpus}{ram}",
        f"- environment `{run.env_name}` (its packages and thread variables)",
        f"- each time is asv's median of {counts} samples per point" if timed else
        "- no asv timing shown: each figure is a value asv tracked once for the commit (a paired ratio with "
        "its interval, a time from its pairs, or an exact count)",
    ]


# The model experiment (benchmarks/bench_model.py): the decode step of SmolLM-135M's shape, and its batch sweep.
MODEL_STEP, MODEL_BATCH = "bench_model.ModelStep.track_", "bench_model.ModelBatch.track_"
MODEL_BLAS = "bench_model.ModelBatchBLAS.track_ratio"
MODEL_CACHE_BYTES = "bench_model.ModelCacheBytes.track_bytes_per_token"


def model_bytes(model):
    """``(weight bytes, K/V bytes a token, crossover B x T)`` of ``model``: arithmetic, the same at every commit."""
    return bench_model.weight_bytes(model), bench_model.kv_bytes_per_token(model), bench_model.crossover(model)


def model_table(run):
    """Model experiment: one B = 1 decode step per T and cache kind, its time and its fraction of the read rate."""
    rows = []
    for t, cache in itertools.product(_keys(run, MODEL_STEP + "ratio", "T", bench_model.STEP_LENGTHS),
                                      _keys(run, MODEL_STEP + "ratio", "cache", bench_model.STEP_CACHES)):
        rows.append(((t, cache), {
            "ms / token": run.value(MODEL_STEP + "token_seconds", T=t, cache=cache),
            "fraction of read bandwidth": paired(run, MODEL_STEP + "ratio", SKIPPED, T=t, cache=cache),
            "step GB/s": run.value(MODEL_STEP + "step_gbps", T=t, cache=cache),
            "read GB/s": run.value(MODEL_STEP + "read_gbps", T=t, cache=cache),
            "bytes / step": bench_model.step_bytes(t, 1) if is_number(t) else SKIPPED,
        }))
    kinds = {"ms / token": "ms", "fraction of read bandwidth": "fraction", "step GB/s": "gbps", "read GB/s": "gbps",
             "bytes / step": "bytes"}
    exact = "; ".join(f"{m}: weights {format_cell(w, 'count')} bytes, K/V {format_cell(kv, 'count')} a token, equal "
                      f"at B x T = {format_cell(x, 'count')}" for m in ("SmolLM-135M", "Llama-3-8B")
                      for w, kv, x in [model_bytes(m)])
    caches = ", ".join(f"{kind} {format_cell(run.value(MODEL_CACHE_BYTES, cache=kind), 'count')}"
                       for kind in bench_model.CACHE_KINDS)
    note = ("SmolLM2-135M-Instruct, its weights read from the model's file as float32 (drawn in the suite where it "
            "is absent); one step (one new token) through the "
            "commit's forward, its caches holding T positions, checked against a float64 oracle first. bytes / step: "
            "every weight once and K and V of T + 1 positions. fraction: the median of per-pair (read time / step time)"
            ", the step timed in turns with np.vdot over the same bytes [its 95 % interval]; ms / token from the same "
            f"pairs. Exact, SmolLM-135M in float32 and Llama-3-8B in bfloat16 (a step reads every weight but an "
            f"untied embedding): {exact}. Bytes per token "
            f"of each cache at SmolLM-135M's shape (4-bit quantized at T = {bench_model.BYTES_LENGTH}): {caches}.")
    return Table("Model experiment: a decode step at SmolLM-135M's shape", ("T", "cache"), kinds, rows, note)


def model_batch_table(run):
    """Model experiment: positions/s of B sequences per step over B = 1's, paired, static caches at T; beside it,
    the same weight products alone (ModelBatchBLAS), what the BLAS allows."""
    rows = []
    has_t = any(key[0] == MODEL_BATCH + "ratio" and "T" in dict(key[1]) for key in run.points)
    lengths = _keys(run, MODEL_BATCH + "ratio", "T", bench_model.BATCH_LENGTHS) if has_t else [bench_model.BATCH_LENGTH]
    for t, b in itertools.product(lengths, _keys(run, MODEL_BATCH + "ratio", "B", bench_model.BATCH_SIZES[1:])):
        at = {"T": t, "B": b} if has_t else {"B": b}
        if run.value(MODEL_BATCH + "ratio", **at) == SKIPPED and t != lengths[0]:
            continue  # a point the suite does not measure (T = 4096 at B < 8)
        rate, scaling = run.value(MODEL_BATCH + "positions_per_second", **at), paired(run, MODEL_BATCH + "ratio",
                                                                                       SKIPPED, **at)
        rows.append(((t, b), {"positions / s": rate, "B = 1, same pairs": _combine(lambda r, s: r / s, rate, scaling),
                              "over B = 1": scaling,
                              "BLAS alone": paired(run, MODEL_BLAS, SKIPPED, B=b) if t == lengths[0] else SKIPPED}))
    note = ("One step of B sequences against static caches of T positions, timed in turns with the B = 1 step. over "
            "B = 1: B x time(B = 1) / time(B), the median of per-pair ratios [its 95 % interval]; B x would mean a step "
            "of B costs what a step of one does. BLAS alone: the same for the step's weight products only (each "
            "layer's seven and the lm_head, each B's fastest formulation), what the BLAS allows the step. " + PAIRED_NOTE)
    return Table("Model experiment: B sequences per step", ("T", "B"),
                 {"positions / s": "rate", "B = 1, same pairs": "rate", "over B = 1": "ratio3", "BLAS alone": "ratio3"},
                 rows, note)


SPECULATIVE = "bench_speculative.SpeculativeCounts.track_"  # + forwards_per_token, accepted_tokens
SPECULATIVE_PAIRED = "bench_speculative.SpeculativeRatios.track_ratio"


def speculative_table(run):
    """Speculative decoding: prompt lookup per prompt and k, its exact counts, and its paired speedup at k = 10."""
    rows = []
    prompts = _keys(run, SPECULATIVE + "accepted_tokens", "prompt", list(bench_speculative.PROMPTS))
    for prompt, k in itertools.product(prompts, bench_speculative.DRAFT_LENGTHS):
        rows.append(((prompt, k), {
            "forwards / token": run.value(SPECULATIVE + "forwards_per_token", prompt=prompt, k=k),
            "drafts accepted": run.value(SPECULATIVE + "accepted_tokens", prompt=prompt, k=k),
            "greedy / prompt lookup": (paired(run, SPECULATIVE_PAIRED, SKIPPED, prompt=prompt)
                                       if k == bench_speculative.SPEEDUP_K else SKIPPED)}))
    note = (f"{bench_speculative.NEW_TOKENS} greedy tokens of SmolLM2-135M-Instruct after each stored prompt (copy: the "
            "answer writes a passage of the prompt again; story: it copies nothing). k: prompt_lookup_num_tokens. "
            "forwards / token: the prefill and each verifying forward, over the tokens (greedy: 1). greedy / prompt "
            "lookup: two whole generate calls, static caches, paired. " + PAIRED_NOTE)
    return Table("Speculative decoding: prompt lookup", ("prompt", "k"),
                 {"forwards / token": "number", "drafts accepted": "count", "greedy / prompt lookup": "ratio"}, rows,
                 note)


TABLES.update(model=model_table, model_batch=model_batch_table, speculative=speculative_table)
OPTIONAL.update(model=MODEL_STEP + "ratio", model_batch=MODEL_BATCH + "ratio", speculative=SPECULATIVE_PAIRED)
