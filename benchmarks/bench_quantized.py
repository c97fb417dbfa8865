"""Quantized KV cache experiment (issue 22): what each kind of code costs in time and bytes, and what it loses.

Kinds (:data:`KINDS`): integer codes of 2, 4 and 8 bits (min-max groups, keys per
channel and values per token: KIVI's layout) and the float8 formats e4m3fn and e5m2,
each with group_size = residual_length = 32 (KIVI's group), decoding the suite's
fixed problem (``timed_inputs``: x ``[T, 64]``, float64) through ``cached_attention``
at T = 64 and 128 (32 and 96 positions quantized). Per point:

- ``QuantizedDecode``: the decode's time (each process checks its point once, in setup);
- ``QuantizedAccuracy``: the cache's bytes per position after the decode, and the output's
  max abs error against the exact float64 attention (``common.oracle``);
- ``QuantizedRatios``: the decode through the quantized cache over the same decode
  through a DynamicCache, paired (``ratios``);
- ``FusedRatios``: one attention step of the last query over a cache given the T = 128 or
  1024 positions in one update, :func:`attend_quantized` (scores from the codes) over
  dequantize-then-``attend``, paired;
- ``QuantizedCounts``: instructions of those two steps at T = 128, int4 (callgrind).

Where the commit has ``check_finite`` (issue 21), both sides of every ratio, the timings and
the counts run with ``check_finite=False`` (``common.library_function``): the mechanism, not its scans. Every point is
checked once per commit, here, before anything is measured (:func:`verified_kind`,
:func:`prefilled`): the decode's last position and both attention steps against
attention over the cache's own K̂/V̂, written here, to 1e-12. Commits without
``QuantizedCache`` skip (NotImplementedError).
"""

import math

import numpy as np

from . import common
from .common import (
    D_K,
    D_V,
    Benchmark,
    Measured,
    assert_float64_close,
    check_single_threaded,
    library_function,
    oracle,
    timed_inputs,
)
from .counts import Counts

KINDS = {"int2": dict(nbits=2), "int4": dict(nbits=4), "int8": dict(nbits=8),
         "float8_e4m3fn": dict(nbits=8, format="float8_e4m3fn"), "float8_e5m2": dict(nbits=8, format="float8_e5m2")}
LENGTHS = [64, 128]
STEP_LENGTHS = [128, 1024]  # one attention step is cheap: a long cache, where reading the codes pays
GROUP_SIZE = RESIDUAL_LENGTH = 32


def quantized_cache(kind):
    """A new, empty ``QuantizedCache`` of ``kind`` for one sequence of the fixed problem (64 key and value channels)."""
    return library_function("QuantizedCache")((), D_K, D_V, group_size=GROUP_SIZE, residual_length=RESIDUAL_LENGTH,
                                              **KINDS[kind])


def attention(q, k, v):
    """``softmax(q kᵀ / sqrt(D_k)) v`` over every key, written here: ``[C, D_v]``."""
    scores = q @ k.T / math.sqrt(q.shape[-1])  # [C, S]
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def checked_decode(kind, t_len):
    """``(out, cache)`` of the decode of the fixed problem through a new cache of ``kind``, once it passed the check.

    The check: the decode's last position, and attend_quantized, equal attention over the cache's own K̂/V̂ (1e-12).
    """
    cache = quantized_cache(kind)  # NotImplementedError (a skip) at a commit without it, before anything else
    decode, attend_quantized = library_function("cached_attention"), library_function("attend_quantized")
    check_single_threaded()
    x, w_q, w_k, w_v = timed_inputs(t_len)
    out = decode(x, w_q, w_k, w_v, cache=cache)
    q = x[-1:] @ w_q  # [1, D_k], the last position's query
    expected = attention(q, *cache.dequantize())  # the last step sees the final K̂/V̂
    key = f"quantized {kind} at T={t_len}"
    assert_float64_close(out[-1:], expected, f"{key}: the decode's last position", rtol=0, atol=1e-12)
    assert_float64_close(attend_quantized(q, cache), expected, f"{key}: attend_quantized",
                         rtol=0, atol=1e-12)
    common.VERIFIED.add(key)
    return out, cache


def verified_kind(kind, t_len):
    """:func:`checked_decode` once per process."""
    if f"quantized {kind} at T={t_len}" not in common.VERIFIED:
        checked_decode(kind, t_len)


def prefilled(kind, t_len):
    """``(q, cache)``: the last query of ``timed_inputs(t_len)`` and a cache given its T keys and values in one update,
    once both attention steps (:func:`steps`) matched attention over the cache's own K̂/V̂ (1e-12), checked here."""
    cache = quantized_cache(kind)  # NotImplementedError (a skip) at a commit without it
    x, w_q, w_k, w_v = timed_inputs(t_len)
    cache.update(x @ w_k, x @ w_v)
    q = x[-1:] @ w_q  # [1, D_k]
    key = f"quantized step {kind} at T={t_len}"
    if key not in common.VERIFIED:
        check_single_threaded()
        expected = attention(q, *cache.dequantize())
        for name, step in steps().items():
            assert_float64_close(step(q, cache), expected, f"{key}: {name}", rtol=0, atol=1e-12)
        common.VERIFIED.add(key)
    return q, cache


def steps():
    """``{"fused": attend_quantized, "dequantized": attend over cache.dequantize()}``: one step each, ``(q, cache)``.

    The path ``update`` offers against the scores from the codes, both unscanned where the commit can
    (``library_function`` binds ``check_finite=False``).
    """
    attend_quantized, attend = library_function("attend_quantized"), library_function("attend")
    return {"fused": attend_quantized, "dequantized": lambda q, cache: attend(q, *cache.dequantize())}


class QuantizedDecode(Benchmark):
    """Full T-step decode of ``x: [T, 64]`` through a new QuantizedCache per call, per kind."""

    params = [LENGTHS, list(KINDS)]
    param_names = ["T", "kind"]
    warmup_time = 0.0
    number = 1
    timeout = 60

    def setup(self, T, kind):
        verified_kind(kind, T)  # once per process, one decode: cheaper than a setup_cache's process
        self.decode, self.inputs = library_function("cached_attention"), timed_inputs(T)

    def time_decode(self, T, kind):
        self.decode(*self.inputs, cache=quantized_cache(kind))

    time_decode.version = "1"  # 1: the T-step decode of timed_inputs(T) through a new cache of the kind


class QuantizedAccuracy(Measured):
    """What one decode of ``x: [T, 64]`` leaves in the cache, in bytes per position, and its output's error."""

    params = [LENGTHS, list(KINDS)]
    param_names = ["T", "kind"]
    timeout = 60

    def measure(self, T, kind):
        """``(bytes per position, max abs error)`` after one decode, behind the check."""
        out, cache = checked_decode(kind, T)
        return cache.nbytes / T, float(np.abs(out - oracle(*timed_inputs(T))).max())

    def track_bytes_per_position(self, measured, T, kind):
        """The cache's nbytes after the decode over T: codes, scales, zeros and the exact residual (float: 1024)."""
        return self.measured[0]

    track_bytes_per_position.unit = "bytes"
    track_bytes_per_position.version = "1"  # 1: nbytes / T after that decode

    def track_max_abs_error(self, measured, T, kind):
        """max |decode output - exact float64 causal attention| over the T x 64 outputs."""
        return self.measured[1]

    track_max_abs_error.unit = "abs error"
    track_max_abs_error.version = "1"  # 1: against common.oracle, the exact float64 attention


class QuantizedCounts(Counts):
    """Instructions of one attention step over a cache of 128 positions: from the codes, or dequantized first.

    int4 at T = 128 only: a count point costs about 1 s of the shared callgrind process (its instrumentation),
    and at T = 1024 the two took 3 s (there the codes save 0.77x of the instructions; at 128, 0.90x).
    """

    params = [["int4"], ["fused", "dequantized"]]
    param_names = ["kind", "path"]

    def prepare(self, kind, path):
        q, cache = prefilled(kind, 128)
        return steps()[path], (q, cache)
