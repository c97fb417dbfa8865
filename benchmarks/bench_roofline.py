"""Roofline experiment: one decode step at model shapes against the memory bandwidth of the same process.

At model shapes one decode step reads the layer's weights and the whole K/V
cache, and memory bandwidth sets its time. Each point times the public step
(``roofline_inputs.decode_step``) in turns with a kernel that reads the same
bytes once (``.sum()`` of the same weights and cache buffers, and for
repeat_kv a buffer of its copies' size), and stores the bandwidth fraction
``(bytes / step time) / (bytes / read time)`` = read time / step time, the
median of the per-pair values with its 95 % interval (``benchmarks/ratios.py``),
beside both rates in GB/s and the bytes (``roofline_inputs.step_bytes``).
"""

import gc
import statistics

import numpy as np

from . import pairs
from .ratios import CLOCK, Ratios
from .roofline_inputs import (
    ROOFLINE_BATCHES,
    ROOFLINE_LENGTHS,
    ROOFLINE_PATHS,
    ROOFLINE_SHAPES,
    layer_weights,
    model_shape,
    not_measured,
    part_bytes,
    step_bytes,
    verified_step,
)

PARAMS = [ROOFLINE_SHAPES, ROOFLINE_LENGTHS, ROOFLINE_BATCHES, ROOFLINE_PATHS]
PARAM_NAMES = ["shape", "T", "B", "path"]


def recorded(side, into):
    """``side``, appending every sample it takes to ``into``."""

    def samples(n):
        out = side(n)
        into.extend(out)
        return out

    return samples


def bandwidth_fraction(step, read, nbytes, seconds, min_pairs):
    """``{"ratio", "low", "high", "pairs", "burst", "bytes", "step_gbps", "read_gbps"}`` of ``step`` and ``read``.

    After one warm-up call of each (a repeat_kv step's first calls fault in its
    copies' fresh pages: 0.5 s, then 0.13 s, then 0.07 s at Llama-3-8B, T = 4096),
    one call a sample (each reads hundreds of MiB), timed by the thread's CPU
    time, the two alternated by :func:`pairs.pairs_within` for about ``seconds``
    (at least ``min_pairs`` pairs), garbage collection off. ratio: the median of
    the per-pair read time / step time; the rates: ``nbytes`` over each side's
    median sample, in 10^9 bytes per second.
    """
    step()
    read()
    step_times, read_times = [], []
    first = recorded(pairs.local_side(step, 1, CLOCK), step_times)
    second = recorded(pairs.local_side(read, 1, CLOCK), read_times)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        fractions = pairs.pairs_within(first, second, seconds, min_pairs, max(min_pairs, 50), burst=1)
    finally:
        if enabled:
            gc.enable()
    median, low, high = pairs.median_interval(fractions)
    return {"ratio": median, "low": low, "high": high, "pairs": len(fractions), "burst": 1, "bytes": nbytes,
            "step_gbps": nbytes / statistics.median(step_times) / 1e9,
            "read_gbps": nbytes / statistics.median(read_times) / 1e9}


def read_kernel(shape, t_len, batch, path, cache):
    """A callable that sums every buffer the step reads, and a buffer of repeat_kv's copies' size: its bytes."""
    arrays = [*layer_weights(shape), cache.k_cache, cache.v_cache]  # K, V [B, H_kv, T + 1, D_head]: the buffers
    copies = part_bytes(*model_shape(shape), t_len, batch, path)["copies"]
    if copies:
        arrays.append(np.ones(copies // 4, np.float32))  # written, so resident (np.zeros maps the zero page)
    nbytes = sum(a.nbytes for a in arrays)
    assert nbytes == step_bytes(shape, t_len, batch, path), f"the read kernel reads {nbytes} bytes"
    return (lambda: [a.sum() for a in arrays]), nbytes


class Roofline(Ratios):
    """One decode step of B sequences against T cached positions, float32, as a fraction of the read bandwidth.

    shape: a key of ``MODEL_SHAPES`` (Llama-3-8B GQA 32/8/128, Llama-2-7B MHA
    32/32/128); T: positions in the cache; B: sequences; path: grouped or
    repeat_kv. ``track_ratio`` (and ``_low``, ``_high``) is the bandwidth fraction,
    measured with the rates in ``setup_cache``; points over the 2 GiB memory
    budget or the time budget (``roofline_inputs.not_measured``) skip, saying why.
    """

    params = PARAMS
    param_names = PARAM_NAMES
    seconds = 0  # the fewest pairs: a pair of the largest points takes 0.3 s
    min_pairs = 6  # the fewest with a 95 % interval (the smallest and largest of 6: 96.9 %)
    timeout = 300

    def setup_cache(self):
        return self.measure_points()

    def sides(self, *point):  # measured by measure() below: the two sides are not a ratio of two timings
        raise NotImplementedError

    def measure(self, shape, T, B, path):
        why = not_measured(shape, T, B, path)
        if why:
            raise NotImplementedError(why)
        step, cache = verified_step(shape, T, B, path)
        read, nbytes = read_kernel(shape, T, B, path, cache)
        return bandwidth_fraction(step, read, nbytes, self.seconds, self.min_pairs)

    def track_step_gbps(self, measured, *point):
        """The step's rate: its bytes over its median time, 10^9 bytes per second."""
        return self.tracked("step_gbps")

    track_step_gbps.unit = "GB/s"
    track_step_gbps.version = "1"

    def track_read_gbps(self, measured, *point):
        """The read kernel's rate over the same bytes, timed in turns with the step: the machine's bandwidth."""
        return self.tracked("read_gbps")

    track_read_gbps.unit = "GB/s"
    track_read_gbps.version = "1"


class RooflineBytes:
    """The bytes one step must read (``roofline_inputs.step_bytes``), at every point, measured or not."""

    params = PARAMS
    param_names = PARAM_NAMES

    def setup(self, shape, T, B, path):
        self.nbytes = step_bytes(shape, T, B, path)

    def track_bytes_read(self, shape, T, B, path):
        return self.nbytes

    track_bytes_read.unit = "bytes"
    track_bytes_read.version = "1"
