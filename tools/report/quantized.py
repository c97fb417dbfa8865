"""The quantized cache's figure: max abs error against bytes per position, one point per configuration.

One point per kind (int2, int4, int8, float8_e4m3fn, float8_e5m2) and length T of
``bench_quantized.QuantizedAccuracy``: the cache's bytes per position after a T-step decode of
the suite's problem, and the output's max abs error against exact float64 attention. Beside
them, as vertical lines, the bit widths the anchors publish, at the bytes their codes alone
take per position of that problem (D_k + D_v = 128 elements, so 16 bytes a bit; their scales,
zeros and residual come on top, as ours do in the points):
Hugging Face's ``QuantizedCache`` (quanto: 2 and 4 bits; HQQ: 1, 2, 3, 4 and 8; by default
q_group_size 64 and residual_length 128) and KIVI (Liu et al. 2024: 2 and 4 bits, group 32,
residual 128); and the float64 cache's 1024 bytes.
"""

import math

from ..results import is_number

BYTES_BENCHMARK = "bench_quantized.QuantizedAccuracy.track_bytes_per_position"
ERROR_BENCHMARK = "bench_quantized.QuantizedAccuracy.track_max_abs_error"
ELEMENTS_PER_POSITION = 128  # D_k + D_v of the suite's problem (64 + 64)
FLOAT64_BYTES = ELEMENTS_PER_POSITION * 8
PUBLISHED = {"KIVI": (2, 4), "HF QuantizedCache, quanto": (2, 4), "HF QuantizedCache, HQQ": (1, 2, 3, 4, 8)}
PUBLISHED_STYLE = {"KIVI": ":", "HF QuantizedCache, quanto": "--", "HF QuantizedCache, HQQ": "-."}


def points(run):
    """``{kind: [(T, bytes per position, max abs error)]}`` of the run's measured points, by T."""
    found = {}
    for (benchmark, params), point in run.points.items():
        if benchmark != BYTES_BENCHMARK or not is_number(point.value):
            continue
        error = run.value(ERROR_BENCHMARK, **dict(params))
        if is_number(error):
            found.setdefault(dict(params)["kind"], []).append((dict(params)["T"], point.value, error))
    return {kind: sorted(rows) for kind, rows in found.items()}


def error_vs_bytes(plt, run, title, lab):
    """The figure (``lab`` is unused: the lab published nothing on quantized caches)."""
    fig, ax = plt.subplots(figsize=(10, 5))
    measured = points(run)
    lengths = sorted({t for rows in measured.values() for t, _, _ in rows})
    markers = dict(zip(lengths, "osD^v"))  # one marker per T, named once in the legend
    for kind, rows in measured.items():
        line, = ax.plot([b for _, b, _ in rows], [e for _, _, e in rows], label=kind)
        for t, b, e in rows:
            ax.plot(b, e, marker=markers[t], color=line.get_color(), linestyle="none")
    for t, marker in markers.items():
        ax.plot([], [], marker=marker, color="grey", linestyle="none", label=f"T = {t} decode steps")
    for bits in sorted({b for widths in PUBLISHED.values() for b in widths}):
        x = bits * ELEMENTS_PER_POSITION / 8
        who = ", ".join(name.replace("HF QuantizedCache, ", "HF ") for name, w in PUBLISHED.items() if bits in w)
        ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
        ax.text(x, 0.98, f" {bits} bit{'s' * (bits > 1)}: {who} ", transform=ax.get_xaxis_transform(), rotation=90,
                va="top", ha="right", fontsize=7, color="dimgrey")
    ax.axvline(FLOAT64_BYTES, color="black", linewidth=0.8)
    ax.text(FLOAT64_BYTES, 0.98, " float64 cache, error 0 ", transform=ax.get_xaxis_transform(), rotation=90,
            va="top", ha="right", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_xticks([16, 32, 64, 128, 256, 512, 1024], ["16", "32", "64", "128", "256", "512", "1024"])
    ax.minorticks_off()
    errors = [e for rows in measured.values() for _, _, e in rows]
    if errors and all(e > 0 and math.isfinite(e) for e in errors):
        ax.set_yscale("log")
    if not errors:
        ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
    ax.set(xlabel="bytes per position (K and V, D = 64 each); dashed: published bit widths, their codes alone",
           ylabel="max abs error of the attention output", title="quantized KV cache, group 32, residual 32")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: it hides no point
    fig.suptitle(f"Quantized cache: error vs bytes — {title}")
    return fig
