"""Traced allocations and lines: bytes allocated and Python lines executed by one decode, traced rather than timed.

"Work" in this suite means the counted channel, callgrind's instructions
(``counts.py``, the gate's work channel). This module is the *tracer*: exact
counts, taken with the standard library only, on the same timed problem the
correctness check verifies:

- bytes allocated: :mod:`tracemalloc` traces numpy's array buffers and
  Python's objects; a :func:`sys.settrace` line hook adds up, line by line,
  how far the traced memory rose above where the line started (its high-water
  mark), so temporaries freed within a line count too. The concat cache's
  O(T²) copying shows here against the preallocated cache's O(T) writes.
- lines per step: Python lines executed per decode step (``kv_attention``'s
  and numpy's own Python code), the interpreter overhead the batch removes.

Both are exact counts of the same code path, identical from run to run (to a
few bytes of interpreter bookkeeping). Each is taken on the second of two
traced decodes, so that first-call caches are warm. Every point is checked and
traced once, in its class's ``setup_cache``, which both tracked values share.

The asv names (``bench_work.CacheWork``, ``bench_work.BatchWork``) are older
than that rule and stay: asv keys every stored result by module.Class.method,
and an explicit ``benchmark_name`` would have to be set on each class's own
copy of the two methods, which the classes share through :class:`_Traced`.
"""

import sys
import tracemalloc

from .common import BATCH, STRATEGIES, Measured, timed_inputs, verified_strategy

TRACED_LENGTHS = [16, 64, 256]  # T: enough to tell O(T) from O(T²) growth


def trace_decode(decode, inputs):
    """Trace one ``decode(*inputs)``: ``(bytes allocated, Python lines executed)``.

    Bytes are the sum over executed lines of the rise of tracemalloc's traced
    memory above its level at the start of the line (the line's peak).
    """
    state = {"start": 0, "bytes": 0, "lines": 0}

    def on_line(frame, event, arg):
        state["bytes"] += max(tracemalloc.get_traced_memory()[1] - state["start"], 0)
        state["lines"] += event == "line"
        tracemalloc.reset_peak()
        state["start"] = tracemalloc.get_traced_memory()[0]
        return on_line

    tracemalloc.start()
    try:
        state["start"] = tracemalloc.get_traced_memory()[0]
        sys.settrace(lambda frame, event, arg: on_line)
        try:
            decode(*inputs)
        finally:
            sys.settrace(None)
    finally:
        tracemalloc.stop()
    return state["bytes"], state["lines"]


class _Traced(Measured):
    """Shared by the cache and batch experiments: the traced bytes and lines of one decode of the timed problem."""

    batch = None  # B of the timed problem; None for one sequence [T, 64]

    def measure(self, T, strategy):
        """``(bytes allocated, lines)`` of the point's checked decode, on its second traced call."""
        decode = verified_strategy(strategy, T, self.batch)
        inputs = timed_inputs(T, self.batch)
        trace_decode(decode, inputs)  # warm: first-call caches allocate once
        return trace_decode(decode, inputs)

    def track_allocated_bytes(self, measured, T, strategy):
        """Bytes allocated during one decode of every sequence (tracemalloc, line high-water marks summed)."""
        return self.measured[0]

    track_allocated_bytes.unit = "bytes"
    # pinned asv hash (9108790): tracemalloc's line high-water marks summed over one decode
    track_allocated_bytes.version = "5906da7072382f287da496886fd5a099853eddafcb3477ef01577bb549e6193c"

    def track_lines_per_step(self, measured, T, strategy):
        """Python lines executed per decode step (lines / T)."""
        return self.measured[1] / T

    track_lines_per_step.unit = "lines"
    # pinned asv hash (9108790): Python lines executed per decode step (sys.settrace)
    track_lines_per_step.version = "6c807854c22a91f3dc37198d3d8f330652fe5f4a9512468190a847c5337bdfdc"


class CacheWork(_Traced):
    """One sequence ``x: [T, 64]``: the traced bytes and lines of each cache strategy's full T-step decode."""

    params = [TRACED_LENGTHS, list(STRATEGIES["cache"])]
    param_names = ["T", "strategy"]


class BatchWork(_Traced):
    """B = 2 sequences ``x: [2, T, 64]``: the traced bytes and lines of the sequential loop vs the batched decode."""

    params = [TRACED_LENGTHS, list(STRATEGIES["batch"])]
    param_names = ["T", "strategy"]
    batch = BATCH
