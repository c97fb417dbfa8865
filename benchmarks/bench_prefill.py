"""Chunked prefill and sliding windows: chunk size from decode-like to one-shot, and the window cache's memory.

The sizes, the banded oracle and the checks of chunked attention are here too,
in the suite, not in ``kv_attention``, for the reason given in ``common.py``.
The timed problem is ``common.timed_inputs(T)`` (one sequence ``[T, 64]``,
float64). Commits without ``chunked_attention`` or ``SlidingWindowCache`` are
skipped (NotImplementedError), so the whole history stays benchmarkable.
"""

import functools
import math
import tracemalloc

import numpy as np

from .common import D_K, D_V, Benchmark, Measured, library_function, timed_inputs, verified_decode
from .counts import Counts

PREFILL_LENGTH = 512  # T of the chunk-size experiment
CHUNK_SIZES = [1, 16, 64, 512]  # 1 is decode, 512 a one-shot prefill
WINDOW_LENGTH = 1024  # T of the window experiment, decoded token by token
# asv parameter -> (window, n_sink); "none" is full attention through a StaticCache of T positions
WINDOWS = {"64": (64, 0), "256": (256, 0), "256+4sinks": (256, 4), "none": (None, 0)}
BYTES_LENGTHS = [256, 1024]  # T at which the cache bytes are tracked: flat for a window, growing without
BYTES_PER_POSITION = (D_K + D_V) * 8  # one position's key and value, float64


def banded_oracle(x, w_q, w_k, w_v, window=None, n_sink=0):
    """Causal attention with a sliding window and sinks, written independently of kv_attention: ``[..., T, D_v]``.

    Position t attends to s when s <= t and (t - s < window or s < n_sink): the
    band between the diagonal and the (window - 1)-th subdiagonal, plus the
    first n_sink columns; ``window=None`` is the plain causal mask.
    """
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = (q @ k.swapaxes(-1, -2)) / math.sqrt(q.shape[-1])  # [..., T, S]; BLAS, 6x einsum's speed at T = 1024
    ones = np.ones((x.shape[-2], x.shape[-2]), dtype=bool)
    allowed = np.tril(ones)
    if window is not None:
        sinks = np.arange(x.shape[-2]) < n_sink  # [S]
        allowed &= np.triu(ones, k=-(window - 1)) | sinks
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def verified_chunked(t_len, chunk_size, window=None, n_sink=0):
    """``chunked_attention`` with chunk_size, window and n_sink bound, checked on ``timed_inputs(t_len)``.

    Against :func:`banded_oracle` at rtol = 1e-7, atol = 1e-8; outcomes as :func:`common.verified_decode`.
    """
    prefill = functools.partial(
        library_function("chunked_attention"), chunk_size=chunk_size, window=window, n_sink=n_sink
    )
    reference = functools.partial(banded_oracle, window=window, n_sink=n_sink)
    key = f"chunked_attention chunk_size={chunk_size}, window={window}, n_sink={n_sink} at T={t_len}"
    return verified_decode(key, prefill, timed_inputs(t_len), reference)


def held_cache_bytes(t_len, chunk_size, window=None, n_sink=0):
    """Logical K/V bytes a prefill of ``timed_inputs(t_len)`` leaves in a cache given to it, both checked.

    The cache is a SlidingWindowCache of the window, else a StaticCache of T
    positions; the prefill into it is checked against :func:`banded_oracle` (as
    :func:`verified_chunked`), then its bytes: T positions without a window,
    min(T, n_sink + window) with one, of (64 + 64) × 8 bytes each (AssertionError otherwise).
    """
    chunked = library_function("chunked_attention")
    if window is None:
        make_cache = functools.partial(library_function("StaticCache"), (), t_len, D_K, D_V)
        expected = t_len
    else:
        make_cache = functools.partial(library_function("SlidingWindowCache"), (), window, D_K, D_V, n_sink=n_sink)
        expected = min(t_len, n_sink + window)
    caches = []

    def prefill_into_a_new_cache(*inputs):
        caches.append(make_cache())
        return chunked(*inputs, chunk_size=chunk_size, window=window, n_sink=n_sink, cache=caches[-1])

    key = f"chunked_attention into a given cache, chunk_size={chunk_size}, window={window}, n_sink={n_sink} at T={t_len}"
    reference = functools.partial(banded_oracle, window=window, n_sink=n_sink)
    verified_decode(key, prefill_into_a_new_cache, timed_inputs(t_len), reference)
    if not caches:  # checked earlier in this process
        prefill_into_a_new_cache(*timed_inputs(t_len))
    nbytes = caches[-1].nbytes
    what = f"cache bytes after chunk_size={chunk_size}, window={window}, n_sink={n_sink} at T={t_len}"
    assert nbytes == expected * BYTES_PER_POSITION, f"{what}: {nbytes}, expected {expected} positions"
    return nbytes


COUNT_LENGTH = 128  # T of PrefillCounts


class ChunkedPrefill(Benchmark):
    """``chunked_attention`` of one sequence ``x: [512, 64]``, float64, full causal, by chunk size.

    chunk_size 1 is decode (512 steps of one query), 512 a one-shot prefill (one
    [512, 512] score matrix); between them the trade-off of per-chunk overhead
    against the size of each chunk's scores.
    """

    params = [CHUNK_SIZES]
    param_names = ["chunk_size"]
    warmup_time = 0.02

    def setup(self, chunk_size):
        self.prefill = verified_chunked(PREFILL_LENGTH, chunk_size)
        self.inputs = timed_inputs(PREFILL_LENGTH)

    def time_prefill(self, chunk_size):
        self.prefill(*self.inputs)

    time_prefill.version = "1"

    def track_peak_bytes(self, chunk_size):
        """Peak bytes allocated during one prefill (tracemalloc): the cache, the output and one chunk's temporaries.

        A chunk of C queries over S keys holds ``[C, S]`` scores and weights, so
        the peak grows with the chunk size: the memory side of the trade-off.
        """
        tracemalloc.start()
        try:
            self.prefill(*self.inputs)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    track_peak_bytes.unit = "bytes"
    track_peak_bytes.version = "1"


class WindowDecode(Benchmark):
    """Token-by-token decode (chunk_size 1) of ``x: [1024, 64]``, float64, with a sliding window or none.

    window: 64, 256, 256 with 4 attention sinks (a SlidingWindowCache of n_sink +
    window slots), or none (full causal attention through a StaticCache of 1024).
    """

    params = [list(WINDOWS)]
    param_names = ["window"]
    warmup_time = 0.02

    def setup(self, window):
        self.decode = verified_chunked(WINDOW_LENGTH, 1, *WINDOWS[window])
        self.inputs = timed_inputs(WINDOW_LENGTH)

    def time_decode(self, window):
        self.decode(*self.inputs)

    time_decode.version = "1"


class ChunkedCacheBytes(Measured):
    """Logical K/V bytes of the StaticCache after the chunked prefill of ``x: [512, 64]``: the same at every chunk size.

    512 × (64 + 64) × 8 bytes. Every point's prefill is run and checked once, in ``setup_cache``.
    """

    params = [CHUNK_SIZES]
    param_names = ["chunk_size"]

    def measure(self, chunk_size):
        return held_cache_bytes(PREFILL_LENGTH, chunk_size)

    def track_kv_cache_bytes(self, measured, chunk_size):
        return self.measured

    track_kv_cache_bytes.unit = "bytes"
    track_kv_cache_bytes.version = "1"


class WindowCacheBytes(Measured):
    """Logical K/V bytes held after a token-by-token decode of T positions: the window cache stays flat.

    (n_sink + window) × 1024 bytes for a window cache once T passes them, T × 1024 for the full cache.
    Every point's decode is run and checked once, in ``setup_cache``.
    """

    params = [list(WINDOWS), BYTES_LENGTHS]
    param_names = ["window", "T"]

    def measure(self, window, T):
        return held_cache_bytes(T, 1, *WINDOWS[window])

    def track_kv_cache_bytes(self, measured, window, T):
        return self.measured

    track_kv_cache_bytes.unit = "bytes"
    track_kv_cache_bytes.version = "1"


class PrefillCounts(Counts):
    """Instructions and estimated cycles of the chunked prefill of ``x: [128, 64]`` at chunk sizes 16 and 64.

    The cheap middle of the sweep, on a quarter of its length: chunk_size 1 (T
    decode steps) and T (one [T, T] BLAS product) cost several times more under
    callgrind, and T = 512 cost 13 s for the two points.
    """

    params = [[16, 64]]
    param_names = ["chunk_size"]

    def prepare(self, chunk_size):
        return verified_chunked(COUNT_LENGTH, chunk_size), timed_inputs(COUNT_LENGTH)
