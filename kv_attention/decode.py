"""Token-by-token decode strategies for one head, each exact against :func:`causal_attention`.

At step t no strategy reads ``x[..., t+1:, :]``; the cached ones read only ``x[..., t, :]`` and their cache.
``x: [T, D_model]`` or ``[B, T, D_model]`` (the batch strategies: the latter only), ``w_q, w_k: [D_model, D_k]``,
``w_v: [D_model, D_v]``, float32 or float64 -> ``[..., T, D_v]``. A given ``cache`` must fit x's leading axes,
D_k, D_v and dtype with room for T more (its positions are attended to), checked before the first write. Finite
inputs whose projections overflow (or pass a QuantizedCache's range) are refused by its ``update`` partway, as
scipy does not look for overflow; ``cache.crop(length)`` undoes the partial write.
"""

import numpy as np

from ._validation import as_flag
from .attention import attention_forward, check_projection_inputs
from .cache import DynamicCache, StaticCache, check_cache_fits


def check_decode_inputs(x, w_q, w_k, w_v, x_ndims, cache, check_finite, window=None, n_sink=0):
    """``(x, w_q, w_k, w_v, dtype, cache)`` checked (``cache`` None: the decode makes its own)."""
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims, as_flag("check_finite", check_finite))
    if cache is not None:
        lead = x.shape[:-2]
        cache = check_cache_fits(cache, (lead + w_k.shape[1:], lead + w_v.shape[1:]), x.shape[-2], dtype, window, n_sink)
    return x, w_q, w_k, w_v, dtype, cache


def _decode(x, w_q, w_k, w_v, update):
    """The decode loop over validated ``x: [..., T, D_model]``, writing each step's k, v with ``update``."""
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=np.result_type(x, w_v))  # [..., T, D_v]
    for t in range(x.shape[-2]):
        x_t = x[..., t : t + 1, :]  # [..., 1, D_model]
        k, v = update(x_t @ w_k, x_t @ w_v)  # [..., t+1, D_k], [..., t+1, D_v]
        out[..., t : t + 1, :] = attention_forward(x_t @ w_q, k, v)  # [..., 1, D_v]
    return out


def _decode_preallocated(x, w_q, w_k, w_v, dtype, cache=None):
    """The preallocated path: a StaticCache of T positions unless ``cache`` is given."""
    if cache is not None:
        return _decode(x, w_q, w_k, w_v, cache.update)
    cache = StaticCache(x.shape[:-2], x.shape[-2], w_k.shape[1], w_v.shape[1], dtype)
    return _decode(x, w_q, w_k, w_v, cache._append)  # its own cache: k, v from checked inputs, and room for T


def decode_without_cache(x, w_q, w_k, w_v, *, check_finite=True):
    """Decode with no cache, as a model without one: step t recomputes ``x[..., :t+1, :]``, O(T³) in all."""
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, (2, 3), as_flag("check_finite", check_finite))
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=dtype)  # [..., T, D_v]
    causal = np.tril(np.ones((x.shape[-2],) * 2, bool))  # [T, T]
    for t in range(x.shape[-2]):
        x_t = x[..., : t + 1, :]  # [..., t+1, D_model]: the whole prefix, projected again at every step
        mask = causal[: t + 1, : t + 1]  # [t+1, t+1]
        out[..., t, :] = attention_forward(x_t @ w_q, x_t @ w_k, x_t @ w_v, mask)[..., -1, :]
    return out


def cached_attention(x, w_q, w_k, w_v, cache=None, *, check_finite=True):
    """Decode with a K/V cache grown by ``np.concatenate`` (default: a new :class:`DynamicCache`)."""
    x, w_q, w_k, w_v, _, cache = check_decode_inputs(x, w_q, w_k, w_v, (2, 3), cache, check_finite)
    if cache is not None:
        return _decode(x, w_q, w_k, w_v, cache.update)
    return _decode(x, w_q, w_k, w_v, DynamicCache()._append)


def cached_attention_preallocated(x, w_q, w_k, w_v, cache=None, *, check_finite=True):
    """Decode with K/V buffers allocated once and written in place (default: a StaticCache of T positions)."""
    x, w_q, w_k, w_v, dtype, cache = check_decode_inputs(x, w_q, w_k, w_v, (2, 3), cache, check_finite)
    return _decode_preallocated(x, w_q, w_k, w_v, dtype, cache)


def sequential_cached_attention(x, w_q, w_k, w_v, *, check_finite=True):
    """The batch baseline: B sequences one after another, each :func:`cached_attention_preallocated`'s path."""
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, (3,), as_flag("check_finite", check_finite))
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=dtype)  # [B, T, D_v]
    for b in range(x.shape[0]):
        out[b] = _decode_preallocated(x[b], w_q, w_k, w_v, dtype)  # [T, D_v]
    return out


def batched_cached_attention(x, w_q, w_k, w_v, cache=None, *, check_finite=True):
    """Decode B sequences together, one NumPy call per operation per step; B stays a batch axis of every matmul."""
    x, w_q, w_k, w_v, dtype, cache = check_decode_inputs(x, w_q, w_k, w_v, (3,), cache, check_finite)
    return _decode_preallocated(x, w_q, w_k, w_v, dtype, cache)
