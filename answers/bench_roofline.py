"""Roofline experiment: one decode step at model shapes against the memory bandwidth of the same process.

At model shapes one decode step reads the layer's weights and the whole K/V
cache, and memory bandwidth sets its time. Each point times the public step
(:func:`decode_step`) in turns with a kernel that reads the same
bytes once (``np.vdot(a, a)`` of the same weights and cache buffers, and for
repeat_kv a buffer of its copies' size: :func:`read_kernel`), and stores the bandwidth fraction
``(bytes / step time) / (bytes / read time)`` = read time / step time, the
median of the per-pair values with its 95 % interval (``benchmarks/ratios.py``),
beside both rates in GB/s. The bytes and the draws are benchmarks/bench_roofline.py's
(:func:`step_bytes`: arithmetic, the same at every commit).

One step is one new token per sequence against a StaticCache already holding
T positions, through the public ``multi_head_decode(..., cache=cache)``,
float32, at a shape of the commit's ``MODEL_SHAPES`` (D_model = H_q·D_head).
Its inputs, int8 draws of ``default_rng([42, ...])`` (:func:`draws`), identical for every commit:

- x ``[B, 1, D_model]``; w_q ``[D_model, H_q·D_head]``, w_k, w_v ``[D_model,
  H_kv·D_head]``, w_o ``[H_q·D_head, D_model]``, each divided by sqrt(D_model);
- K, V ``[B, H_kv, T, D_head]``, written into a ``StaticCache((B, H_kv), T + 1,
  D_head, D_head, float32)`` by ``update``, 512 positions at a time (not by
  decoding T positions).

They live in the suite, not in ``kv_attention``, for the reason given in
``benchmarks/common.py``: the package under test must not supply its own inputs or its
own reference. The step runs with the library's default checks
(``library_function(..., check_finite=True)``): the public API as a caller has it.
"""

import functools
import gc
import inspect
import math
import statistics

import numpy as np

from benchmarks import pairs
from benchmarks.bench_roofline import (ROOFLINE_BATCHES, ROOFLINE_LENGTHS, ROOFLINE_PATHS, ROOFLINE_SHAPES, draws,
                                       model_shape, part_bytes, step_bytes)
from benchmarks.common import library_function, read_only, verified_decode
from benchmarks.ratios import CLOCK, Ratios

MAX_RESIDENT = 2 * 2**30  # bytes: the experiment's memory budget
MAX_POSITIONS = 4096  # B x T: beyond it, B = 1 only (the time budget): B = 4 at T = 1024 only
CHUNK = 512  # positions drawn and written at a time
RTOL = ATOL = 2e-5  # float32 against a float64 oracle, after sums over D_model = 4096 and T + 1 keys


def resident_bytes(shape, t_len, batch, path):
    """The most a point holds at once, chunks of CHUNK positions aside: the weights, the cache, and for repeat_kv
    the step's copies and the read kernel's buffer of their size."""
    part = part_bytes(*model_shape(shape), t_len, batch, path)
    return part["weights"] + part["kv"] + 2 * part["copies"]


def not_measured(shape, t_len, batch, path):
    """Why a point is left out (a sentence), or None: repeat_kv at G = 1, over MAX_RESIDENT, or B > 1 over
    MAX_POSITIONS (time)."""
    n_heads, n_kv_heads, _ = model_shape(shape)
    if path == "repeat_kv" and n_heads == n_kv_heads:
        return "G = 1: repeat_kv copies nothing, so the step is the grouped point's (measured equal to it within noise)"
    resident = resident_bytes(shape, t_len, batch, path)
    if resident > MAX_RESIDENT:
        return f"needs {resident / 2**30:.2f} GiB resident, over the experiment's 2 GiB"
    if batch > 1 and batch * t_len > MAX_POSITIONS:
        return (f"B x T = {batch * t_len} cached positions, over {MAX_POSITIONS}: "
                "for the 15 s budget the largest points are measured at B = 1 only")
    return None


@functools.lru_cache(maxsize=1)
def layer_weights(shape):
    """``(w_q, w_k, w_v, w_o)`` of ``shape`` (module docstring): one shape's weights held at a time."""
    n_heads, n_kv_heads, head_dim = model_shape(shape)
    d_model = n_heads * head_dim
    scale = 1 / math.sqrt(d_model)
    return (draws((2,), (d_model, n_heads * head_dim), scale), draws((3,), (d_model, n_kv_heads * head_dim), scale),
            draws((4,), (d_model, n_kv_heads * head_dim), scale), draws((5,), (n_heads * head_dim, d_model), scale))


def layer_inputs(shape, batch):
    """``(x, w_q, w_k, w_v, w_o)``: x ``[B, 1, D_model]`` is the first B rows of the same 4 (one draw per shape)."""
    n_heads, _, head_dim = model_shape(shape)
    x = draws((1,), (max(ROOFLINE_BATCHES), 1, n_heads * head_dim))
    return (x[:batch], *layer_weights(shape))


def projected(x, w, rows=512):
    """``x @ w`` in float64, ``x: [B, D_in]``, converting ``w: [D_in, D_out]`` ``rows`` rows at a time."""
    out = np.zeros((x.shape[0], w.shape[1]))
    for i in range(0, w.shape[0], rows):
        out += x[:, i:i + rows].astype(np.float64) @ w[i:i + rows].astype(np.float64)
    return out


@functools.lru_cache(maxsize=1)
def new_position(shape):
    """``(q, k_new, v_new)``: the 4 sequences' new position, float64, ``[4, H_q·D_head]``, ``[4, H_kv·D_head]`` x2."""
    x, w_q, w_k, w_v, _ = layer_inputs(shape, max(ROOFLINE_BATCHES))
    return tuple(read_only(projected(x[:, 0, :], w))[0] for w in (w_q, w_k, w_v))


def kv_chunks(shape, t_len, batch, part):
    """The cache's K (``part`` 6) or V (7), ``[B, H_kv, T, D_head]``, as read-only chunks of CHUNK positions, in order.

    Drawn chunk by chunk (module docstring), so that neither the fill nor the
    oracle holds a second copy of the cache.
    """
    _, n_kv_heads, head_dim = model_shape(shape)
    for start in range(0, t_len, CHUNK):
        yield draws((part, t_len, batch, start), (batch, n_kv_heads, min(CHUNK, t_len - start), head_dim))


def step_oracle(q, k_new, v_new, k_chunks, v_chunks, w_o, n_heads, n_kv_heads):
    """One decode step written independently of kv_attention, in float64: ``[B, 1, D_out]``.

    ``q: [B, H_q·D_head]``, ``k_new, v_new: [B, H_kv·D_head]``: the new position's
    projections (:func:`new_position`); ``k_chunks``, ``v_chunks``: the T cached
    positions' keys and values ``[B, H_kv, C, D_head]``, chunk by chunk in order.
    Query head h (row ``h % G`` of group ``h // G``) attends over K/V head ``h // G``'s
    T cached positions and the new one: scores of every position first, then the
    softmax, then the weighted values. The heads are concatenated in order and
    projected by ``w_o``.
    """
    batch, head_dim = q.shape[0], k_new.shape[1] // n_kv_heads
    group = n_heads // n_kv_heads
    q = q.reshape(batch, n_kv_heads, group, head_dim)  # [B, H_kv, G, D_head]
    k_new, v_new = (a.reshape(batch, n_kv_heads, 1, head_dim) for a in (k_new, v_new))  # [B, H_kv, 1, D_head]
    scores = [q @ k.astype(np.float64).swapaxes(-1, -2) for k in k_chunks]  # [B, H_kv, G, C] each, in order
    scores = np.concatenate([*scores, q @ k_new.swapaxes(-1, -2)], axis=-1) / math.sqrt(head_dim)  # [.., G, T + 1]
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    heads = weights[..., -1:] @ v_new  # [B, H_kv, G, D_head]: the new position's share
    start = 0
    for v in v_chunks:
        heads += weights[..., start:start + v.shape[-2]] @ v.astype(np.float64)
        start += v.shape[-2]
    return projected(heads.reshape(batch, n_heads * head_dim), w_o)[:, None, :]  # [B, 1, D_out]


_FILLED = {}  # (shape, T, B) -> (cache, expected): one point's cache held at a time, shared by both paths


def filled_cache(shape, t_len, batch):
    """``(cache, expected)``: a StaticCache of T + 1 positions holding K and V's T, and the oracle's next step.

    The cache is written by ``update``, CHUNK positions at a time; the oracle
    draws K and V again, never reading the cache. The previous point's cache is
    dropped first, so that two are never held. NotImplementedError when the
    commit lacks StaticCache or float32 caches.
    """
    key = (shape, t_len, batch)
    if key not in _FILLED:
        _FILLED.clear()
        n_heads, n_kv_heads, head_dim = model_shape(shape)
        static_cache = library_function("StaticCache")
        if "dtype" not in inspect.signature(static_cache).parameters:
            raise NotImplementedError("StaticCache has no dtype at this commit: no float32 cache")
        cache = static_cache((batch, n_kv_heads), t_len + 1, head_dim, head_dim, np.float32)
        for k, v in zip(kv_chunks(shape, t_len, batch, 6), kv_chunks(shape, t_len, batch, 7)):
            cache.update(k, v)  # [B, H_kv, C, D_head] each, after the positions written so far
        q, k_new, v_new = (a[:batch] for a in new_position(shape))
        expected = step_oracle(q, k_new, v_new, kv_chunks(shape, t_len, batch, 6), kv_chunks(shape, t_len, batch, 7),
                               layer_weights(shape)[3], n_heads, n_kv_heads)
        _FILLED[key] = cache, expected
    return _FILLED[key]


def decode_step(shape, t_len, batch, path):
    """``(step, cache)``: ``step()`` decodes one new position through ``cache`` and crops it back to T."""
    decode = library_function("multi_head_decode", check_finite=True)  # its default checks
    if "cache" not in inspect.signature(decode).parameters:
        raise NotImplementedError("multi_head_decode takes no cache at this commit")
    n_heads, n_kv_heads, _ = model_shape(shape)
    cache, _ = filled_cache(shape, t_len, batch)
    inputs = layer_inputs(shape, batch)

    def step():
        try:
            return decode(*inputs, n_heads=n_heads, n_kv_heads=n_kv_heads, path=path, cache=cache)
        finally:
            cache.crop(t_len)  # one position zeroed: the cache holds T again

    return step, cache


def verified_step(shape, t_len, batch, path):
    """:func:`decode_step`, once its step matched :func:`step_oracle` (rtol = atol = 2e-5, float32 out)."""
    step, cache = decode_step(shape, t_len, batch, path)
    _, expected = filled_cache(shape, t_len, batch)

    def checked(*_):
        out = step()
        assert out.dtype == np.float32, f"float32 inputs gave {out.dtype}"
        assert cache.get_seq_length() == t_len, f"the cache holds {cache.get_seq_length()} positions, not {t_len}"
        return out.astype(np.float64)

    key = f"roofline {path} {shape} at T={t_len}, B={batch}"
    verified_decode(key, checked, (), lambda: expected, rtol=RTOL, atol=ATOL)
    return step, cache


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
    """A callable that reads every buffer the step reads once, and a buffer of repeat_kv's copies' size: its bytes.

    Each buffer is reduced by BLAS's dot with itself (``np.vdot(a, a)``: each element
    loaded once, the second load from L1), the fastest single-threaded read measured
    here: 26-36 GB/s where ``a.sum()``, numpy's pairwise sum, reads 16-21 (256 MiB,
    float32, OpenBLAS Haswell and SkylakeX kernels). Against ``.sum()`` a step's
    matrix-vector products read "faster than the bandwidth", fractions over 1.
    """
    arrays = [*layer_weights(shape), cache.k_cache, cache.v_cache]  # K, V [B, H_kv, T + 1, D_head]: the buffers
    copies = part_bytes(*model_shape(shape), t_len, batch, path)["copies"]
    if copies:
        arrays.append(np.ones(copies // 4, np.float32))  # written, so resident (np.zeros maps the zero page)
    nbytes = sum(a.nbytes for a in arrays)
    assert nbytes == step_bytes(shape, t_len, batch, path), f"the read kernel reads {nbytes} bytes"
    return (lambda: [np.vdot(a, a) for a in arrays]), nbytes  # contiguous buffers: vdot copies none



class Roofline(Ratios):
    """One decode step of B sequences against T cached positions, float32, as a fraction of the read bandwidth.

    shape: a key of ``MODEL_SHAPES`` (Llama-3-8B GQA 32/8/128, Llama-2-7B MHA
    32/32/128); T: positions in the cache; B: sequences; path: grouped or
    repeat_kv. ``track_ratio`` (and ``_low``, ``_high``: its 95 % interval) is the
    bandwidth fraction, the median of the per-pair read time / step time,
    measured with the rates in ``setup_cache``; points over the 2 GiB memory
    budget or the time budget (:func:`not_measured`) skip, saying why.
    """

    params = PARAMS
    param_names = PARAM_NAMES
    version = "2"  # of the fraction: the read kernel is np.vdot (read_kernel), no longer .sum()
    seconds = 0  # the fewest pairs: a pair of the largest points takes 0.3 s
    min_pairs = 6  # the fewest with a 95 % interval (the smallest and largest of 6: 96.9 %)
    timeout = 300

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
    track_read_gbps.version = "2"
