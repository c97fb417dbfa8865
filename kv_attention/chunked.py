"""Chunked prefill: a sequence attended to ``chunk_size`` positions at a time onto one K/V cache.

Servers prefill a prompt in chunks onto the cache that decode then continues
from (vLLM's chunked prefill, bounded by ``max_num_batched_tokens``; Agrawal et
al. 2023, "SARATHI"). Each chunk projects its C positions, hands their keys and
values to the cache, and its queries attend to the keys the cache returns under
the mask of :func:`~kv_attention.attention.band_mask` taken at *absolute*
positions: query i of a chunk after L cached positions is position L + i, so
the causal diagonal is offset by L (FlashAttention aligns its causal mask to the
bottom-right corner for the same reason; a square mask there is the bug of
meta-llama/llama#899). ``chunk_size=1`` is decode, ``chunk_size >= T`` a one-shot
prefill, and every chunk size gives :func:`~kv_attention.attention.causal_attention`
with the same ``window`` and ``n_sink``, position by position.

Inputs: ``x: [T, D_model]`` or ``[B, T, D_model]``, ``w_q, w_k: [D_model, D_k]``,
``w_v: [D_model, D_v]``, float32 or float64; the output ``[..., T, D_v]`` is in
``np.result_type`` of the inputs. For a chunk of C positions:
    x_c   [..., C, D_model]     q_c     [..., C, D_k]
    k     [..., S, D_k]         scores  [..., C, S]     (S: the keys the cache returns, held and new)
    v     [..., S, D_v]         out_c   [..., C, D_v]
``cache``: by default a new :class:`~kv_attention.window.SlidingWindowCache` when
``window`` is given (memory O(window) whatever T), else a StaticCache of T
positions. A given cache (StaticCache, DynamicCache, SlidingWindowCache) must fit
x's leading axes, D_k, D_v and the dtype, and continues from the positions in it:
a prefill of 7 positions, then a chunk of 9, is one 16-position pass. A
SlidingWindowCache must keep the call's ``window`` and ``n_sink``; a cache of
every position serves any window (the mask drops the keys outside it).

Bad input raises TypeError or ValueError, named, before anything is computed or
written. ``check_finite`` (default True) scans x and the weights for NaN/inf.
"""

import numpy as np

from ._validation import as_size
from .attention import band_mask, check_window, scaled_scores, softmax
from .cache import StaticCache
from .decode import check_decode_inputs
from .window import SlidingWindowCache


def _blocked(start, stop, k_positions, window, n_sink):
    """``[C, S]`` bool, True where query ``start + i`` may not attend key ``k_positions[j]``; None if nothing is."""
    blocked = ~band_mask(np.arange(start, stop), k_positions, window, n_sink)  # [C, S]
    return blocked if blocked.any() else None


def _attend_chunk(q, k, v, blocked):
    """``q: [..., C, D_k]`` over ``k: [..., S, D_k]``, ``v: [..., S, D_v]``, no weight where ``blocked: [C, S]``."""
    scores = scaled_scores(q, k)  # [..., C, S]
    if blocked is not None:
        scores[..., blocked] = -np.inf  # a query always attends its own position, so no row is all -inf
    return softmax(scores) @ v  # [..., C, D_v]


def _prefill(x, w_q, w_k, w_v, chunk_size, window, n_sink, cache):
    """The chunk loop over validated ``x: [..., T, D_model]`` through ``cache``."""
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=np.result_type(x, w_v))  # [..., T, D_v]
    # A decode step through a cache of the call's window (None: every position) gets exactly the keys it attends to.
    exact_steps = cache.window == window
    for begin in range(0, x.shape[-2], chunk_size):
        x_c = x[..., begin : begin + chunk_size, :]  # [..., C, D_model]
        start = cache.get_seq_length()
        stop = start + x_c.shape[-2]
        if exact_steps and stop - start == 1:
            blocked = None
        else:
            blocked = _blocked(start, stop, cache.key_positions(stop - start), window, n_sink)  # [C, S] or None
        k, v = cache.update(x_c @ w_k, x_c @ w_v)  # [..., S, D_k], [..., S, D_v]
        out[..., begin : begin + x_c.shape[-2], :] = _attend_chunk(x_c @ w_q, k, v, blocked)  # [..., C, D_v]
    return out


def chunked_attention(x, w_q, w_k, w_v, *, chunk_size, window=None, n_sink=0, cache=None, check_finite=True):
    """Causal (banded, with ``window``/``n_sink``) attention over ``x``, ``chunk_size`` positions at a time.

    Equals ``causal_attention(x, w_q, w_k, w_v, window=window, n_sink=n_sink)``
    position by position when the cache starts empty; the last chunk may be
    shorter. T = 0 gives an empty array and leaves the cache as it was.
    """
    chunk_size = as_size("chunk_size", chunk_size, minimum=1)
    window, n_sink = check_window(window, n_sink)
    x, w_q, w_k, w_v, dtype, cache = check_decode_inputs(x, w_q, w_k, w_v, (2, 3), cache, check_finite,
                                                         window=window, n_sink=n_sink)
    lead, d_k, d_v = x.shape[:-2], w_k.shape[1], w_v.shape[1]
    if cache is None:
        if window is None:
            cache = StaticCache(lead, x.shape[-2], d_k, d_v, dtype)
        else:
            cache = SlidingWindowCache(lead, window, d_k, d_v, n_sink, dtype)
    return _prefill(x, w_q, w_k, w_v, chunk_size, window, n_sink, cache)
