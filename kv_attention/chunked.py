"""Chunked prefill: a sequence attended to ``chunk_size`` positions at a time onto one K/V cache.

Each chunk hands its C positions' keys and values to the cache, and its queries attend to the keys the cache returns
under :func:`~kv_attention.attention.band_mask` at absolute positions: query i of a chunk after L cached positions is
position L + i, the causal diagonal offset by L (FlashAttention's bottom-right alignment). As vLLM's chunked prefill
(Agrawal et al. 2023, "SARATHI"), a prompt is computed in chunks onto the cache decode continues from; vLLM sizes
chunks by a step's shared token budget (see ``scheduler``), here one sequence is cut into equal chunks. Shapes:
``x_c [..., C, D_model]``, ``k [..., S, D_k]``, ``v [..., S, D_v]`` (S: the keys the cache returns), ``out_c [..., C,
D_v]``. ``cache``: default a :class:`~kv_attention.window.SlidingWindowCache` with ``window``, else a StaticCache of T
positions; a given cache continues from its positions. Bad input raises TypeError or ValueError, named, before
anything is written; ``check_finite`` (default True) scans x and the weights for NaN/inf.
"""

import numpy as np

from ._validation import as_size
from .attention import attention_forward, band_mask, check_window
from .cache import StaticCache
from .decode import check_decode_inputs
from .window import SlidingWindowCache


def chunked_attention(x, w_q, w_k, w_v, *, chunk_size, window=None, n_sink=0, cache=None, check_finite=True):
    """Causal (banded, with ``window``/``n_sink``) attention over ``x``, ``chunk_size`` positions at a time.

    Equals ``causal_attention(x, w_q, w_k, w_v, window=window, n_sink=n_sink)`` position by position when the cache
    starts empty; the last chunk may be shorter. T = 0 gives an empty array and leaves the cache as it was.
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
    out = np.empty(x.shape[:-1] + (d_v,), dtype=np.result_type(x, w_v))  # [..., T, D_v]
    # A decode step through a cache of the call's window (None: every position) gets exactly the keys it attends to.
    exact_steps = cache.window == window
    for begin in range(0, x.shape[-2], chunk_size):
        x_c = x[..., begin : begin + chunk_size, :]  # [..., C, D_model]
        start = cache.get_seq_length()
        stop = start + x_c.shape[-2]
        mask = None
        if not (exact_steps and stop - start == 1):
            mask = band_mask(np.arange(start, stop), cache.key_positions(stop - start), window, n_sink)  # [C, S]
            mask = None if mask.all() else mask
        k, v = cache.update(x_c @ w_k, x_c @ w_v)  # [..., S, D_k], [..., S, D_v]
        out[..., begin : begin + x_c.shape[-2], :] = attention_forward(x_c @ w_q, k, v, mask)  # [..., C, D_v]
    return out
