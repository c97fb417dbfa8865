"""What the prefill benchmarks share: their sizes, the banded oracle and the checks of chunked attention.

Like ``common.py``, these live in the suite, not in ``kv_attention``: the
package comes from the commit under test and must not supply its own
reference. The timed problem is ``common.timed_inputs(T)`` (one sequence
``[T, 64]``, float64). Commits without ``chunked_attention`` or
``SlidingWindowCache`` are skipped (NotImplementedError), so the whole history
stays benchmarkable.
"""

import functools
import math

import numpy as np

from .common import D_K, D_V, library_function, timed_inputs, verified_decode

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
