"""Chunked prefill and sliding windows: chunk size from decode-like to one-shot, and the window cache's memory."""

import functools
import tracemalloc

from .common import Benchmark, check_points, replay, timed_inputs
from .counts import Counts
from .ratios import Ratios, Side
from .prefill_inputs import (
    BYTES_LENGTHS,
    CHUNK_SIZES,
    PREFILL_LENGTH,
    WINDOW_LENGTH,
    WINDOWS,
    held_cache_bytes,
    verified_chunked,
)

COUNT_LENGTH = 128  # T of PrefillCounts


class ChunkedPrefill(Benchmark):
    """``chunked_attention`` of one sequence ``x: [512, 64]``, float64, full causal, by chunk size.

    chunk_size 1 is decode (512 steps of one query), 512 a one-shot prefill (one
    [512, 512] score matrix); between them the trade-off of per-chunk overhead
    against the size of each chunk's scores.
    """

    params = [CHUNK_SIZES]
    param_names = ["chunk_size"]
    repeat = (5, 15, 0.3)  # in 2 rounds, each process checking the prefill again
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
    repeat = (3, 6, 0.3)
    warmup_time = 0.02

    def setup(self, window):
        self.decode = verified_chunked(WINDOW_LENGTH, 1, *WINDOWS[window])
        self.inputs = timed_inputs(WINDOW_LENGTH)

    def time_decode(self, window):
        self.decode(*self.inputs)

    time_decode.version = "1"


class ChunkedCacheBytes(Benchmark):
    """Logical K/V bytes of the StaticCache after the chunked prefill of ``x: [512, 64]``: the same at every chunk size.

    512 × (64 + 64) × 8 bytes. Every point's prefill is run and checked once, in ``setup_cache``.
    """

    params = [CHUNK_SIZES]
    param_names = ["chunk_size"]

    def setup_cache(self):
        return check_points(self.params, functools.partial(held_cache_bytes, PREFILL_LENGTH))

    def setup(self, nbytes, chunk_size):
        self.nbytes = replay(nbytes, (chunk_size,))  # in setup: a commit without chunked_attention skips

    def track_kv_cache_bytes(self, nbytes, chunk_size):
        return self.nbytes

    track_kv_cache_bytes.unit = "bytes"
    track_kv_cache_bytes.version = "1"


class WindowCacheBytes(Benchmark):
    """Logical K/V bytes held after a token-by-token decode of T positions: the window cache stays flat.

    (n_sink + window) × 1024 bytes for a window cache once T passes them, T × 1024 for the full cache.
    Every point's decode is run and checked once, in ``setup_cache``.
    """

    params = [list(WINDOWS), BYTES_LENGTHS]
    param_names = ["window", "T"]

    def setup_cache(self):
        return check_points(self.params, lambda window, t_len: held_cache_bytes(t_len, 1, *WINDOWS[window]))

    def setup(self, nbytes, window, T):
        self.nbytes = replay(nbytes, (window, T))  # in setup: a commit without SlidingWindowCache skips

    def track_kv_cache_bytes(self, nbytes, window, T):
        return self.nbytes

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


class PrefillRatios(Ratios):
    """Chunked / one-shot prefill of ``x: [512, 64]`` per chunk size: ChunkedPrefill's calls timed in turns, paired."""

    params = [CHUNK_SIZES[:-1]]
    param_names = ["chunk_size"]

    def setup_cache(self):
        return self.measure_points()

    def sides(self, chunk_size):
        return (Side(verified_chunked(PREFILL_LENGTH, chunk_size), timed_inputs(PREFILL_LENGTH)),
                Side(verified_chunked(PREFILL_LENGTH, CHUNK_SIZES[-1]), timed_inputs(PREFILL_LENGTH)))
