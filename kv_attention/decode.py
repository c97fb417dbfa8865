"""Token-by-token decode strategies for one head, each exact against :func:`causal_attention`.

At step t no strategy reads ``x[..., t+1:, :]``; the cached ones read only
``x[..., t, :]`` and their cache, and none projects all of ``x`` up front (that
would be prefill, not decode).

Inputs: ``x: [T, D_model]`` (``[B, T, D_model]`` for the batch strategies),
``w_q, w_k: [D_model, D_k]``, ``w_v: [D_model, D_v]``, float32 or float64; the
output ``[..., T, D_v]`` is in ``np.result_type`` of the inputs. At step t:
    x_t      [..., 1, D_model]      q_t      [..., 1, D_k]
    k_cache  [..., t+1, D_k]        scores   [..., 1, t+1]
    v_cache  [..., t+1, D_v]        out_t    [..., 1, D_v]
An optional ``cache`` (a :class:`~kv_attention.cache.Cache`, e.g. Hugging Face's
dynamic or static cache) must fit x's leading axes, D_k, D_v and dtype and have
room for T more positions; positions already in it are attended to (a prefill).

Bad input raises before anything is computed: TypeError for an input that is not
a float32/float64 array, a non-cache or a cache of another dtype; ValueError for
shapes that do not fit (named in the message), NaN/inf, a cache that does not fit
or is too short, or scores that overflow. A failed call leaves a given cache unchanged.
"""

import numpy as np

from ._validation import check_cache_fits, check_finite_output, check_projection_inputs
from .attention import _causal_attention, attend
from .cache import DynamicCache, StaticCache, check_is_cache, rolled_back_on_error


def _checked(cache, x, w_q, w_k, w_v):
    """A caller's ``cache``, once it is known to be a Cache that fits validated ``x`` and weights."""
    check_is_cache(cache)
    check_cache_fits(cache, x, w_q, w_k, w_v, np.result_type(x, w_v))
    return cache


def _decode(x, w_q, w_k, w_v, cache):
    """The decode loop over validated ``x: [..., T, D_model]`` through ``cache``."""
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=np.result_type(x, w_v))  # [..., T, D_v]
    with rolled_back_on_error(cache), np.errstate(over="ignore", invalid="ignore"):
        for t in range(x.shape[-2]):
            x_t = x[..., t : t + 1, :]  # [..., 1, D_model]
            k, v = cache.update(x_t @ w_k, x_t @ w_v)  # [..., t+1, D_k], [..., t+1, D_v]
            out[..., t : t + 1, :] = attend(x_t @ w_q, k, v)  # [..., 1, D_v]
        check_finite_output(out)
    return out


def _decode_preallocated(x, w_q, w_k, w_v, cache=None):
    """The preallocated path for validated ``x: [..., T, D_model]``: a StaticCache of T positions by default."""
    if cache is None:
        dtype = np.result_type(x, w_k)
        cache = StaticCache(x.shape[:-2], x.shape[-2], w_k.shape[1], w_v.shape[1], dtype)
    else:
        cache = _checked(cache, x, w_q, w_k, w_v)
    return _decode(x, w_q, w_k, w_v, cache)


def decode_without_cache(x, w_q, w_k, w_v):
    """Decode with no cache: step t recomputes causal attention over ``x[:t+1]``, O(T³) in all.

    What a model without a KV cache does: it re-runs its whole context for every new token.
    """
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2,))
    out = np.empty((x.shape[0], w_v.shape[1]), dtype=dtype)  # [T, D_v]
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(x.shape[0]):
            out[t] = _causal_attention(x[: t + 1], w_q, w_k, w_v)[-1]  # prefix [t+1, D_v] -> last row
    check_finite_output(out)
    return out


def cached_attention(x, w_q, w_k, w_v, cache=None):
    """Decode with a K/V cache grown by ``np.concatenate`` (default: a new :class:`DynamicCache`)."""
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2,))
    return _decode(x, w_q, w_k, w_v, DynamicCache() if cache is None else _checked(cache, x, w_q, w_k, w_v))


def cached_attention_preallocated(x, w_q, w_k, w_v, cache=None):
    """Decode with K/V buffers allocated once and written in place (default: a StaticCache of T positions)."""
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2,))
    return _decode_preallocated(x, w_q, w_k, w_v, cache)


def sequential_cached_attention(x, w_q, w_k, w_v):
    """Decode B sequences one after another in a Python loop: the batch baseline.

    Each takes the path of :func:`cached_attention_preallocated` (inputs validated
    once for all B), so it differs from :func:`batched_cached_attention` only in
    how many NumPy calls are made.
    """
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(3,))
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=dtype)  # [B, T, D_v]
    for b in range(x.shape[0]):
        out[b] = _decode_preallocated(x[b], w_q, w_k, w_v)  # [T, D_v], validated above
    return out


def batched_cached_attention(x, w_q, w_k, w_v, cache=None):
    """Decode B sequences together, one NumPy call per operation per step.

    The cache is ``[B, T, D]`` (default: a new StaticCache of T positions); every
    matmul keeps B as a batch axis, so sequences never mix.
    """
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(3,))
    return _decode_preallocated(x, w_q, w_k, w_v, cache)

