"""Chunked prefill: a sequence attended to ``chunk_size`` positions at a time onto one K/V cache.

Each chunk projects its C positions, hands their keys and values to the cache, and
its queries attend to the keys the cache returns under
:func:`~kv_attention.attention.band_mask` at absolute positions: query i of a chunk
after L cached positions is position L + i, the causal diagonal offset by L (as
FlashAttention aligns its causal mask bottom-right). Every ``chunk_size`` gives
:func:`~kv_attention.attention.causal_attention` with the same ``window`` and
``n_sink``. What matches vLLM's chunked prefill (Agrawal et al. 2023, "SARATHI"): a
prompt computed in chunks onto the cache decode continues from. What differs: vLLM
sizes chunks by a step's token budget shared with other requests (see ``scheduler``);
here one sequence is cut into equal chunks. For a chunk of C positions:
    x_c   [..., C, D_model]     q_c     [..., C, D_k]
    k     [..., S, D_k]         scores  [..., C, S]     (S: the keys the cache returns)
    v     [..., S, D_v]         out_c   [..., C, D_v]
``cache``: default a :class:`~kv_attention.window.SlidingWindowCache` when ``window`` is
given, else a StaticCache of T positions; a given cache continues from its positions.
Bad input raises TypeError or ValueError, named, before anything is written;
``check_finite`` (default True) scans x and the weights for NaN/inf.
"""

import numpy as np

from ._validation import as_size
from .attention import attention_forward, band_mask, check_window
from .cache import StaticCache
from .decode import check_decode_inputs
from .window import SlidingWindowCache


def chunk_mask(start, stop, key_positions, window=None, n_sink=0):
    """``[C, S]`` bool, True where query position ``start + i`` may attend ``key_positions[j]``
    (:func:`~kv_attention.attention.band_mask`); None when every query may attend every key."""
    allowed = band_mask(np.arange(start, stop), key_positions, window, n_sink)  # [C, S]
    return None if allowed.all() else allowed


def _prefill(x, w_q, w_k, w_v, chunk_size, window, n_sink, cache):
    """The chunk loop over validated ``x: [..., T, D_model]`` through ``cache``."""
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=np.result_type(x, w_v))  # [..., T, D_v]
    # A decode step through a cache of the call's window (None: every position) gets exactly the keys it attends to.
    exact_steps = cache.window == window
    for begin in range(0, x.shape[-2], chunk_size):
        x_c = x[..., begin : begin + chunk_size, :]  # [..., C, D_model]
        start = cache.get_seq_length()
        stop = start + x_c.shape[-2]
        key_positions = cache.key_positions(stop - start)
        mask = None if exact_steps and stop - start == 1 else chunk_mask(start, stop, key_positions, window, n_sink)
        k, v = cache.update(x_c @ w_k, x_c @ w_v)  # [..., S, D_k], [..., S, D_v]
        out[..., begin : begin + x_c.shape[-2], :] = attention_forward(x_c @ w_q, k, v, mask)  # [..., C, D_v]
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
