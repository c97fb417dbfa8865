"""Token-by-token decode strategies for one head, each exact against :func:`causal_attention`.

At step t no strategy reads ``x[..., t+1:, :]``; the cached ones read only
``x[..., t, :]`` and their cache, and none projects all of ``x`` up front (that
would be prefill, not decode).

Inputs: ``x: [T, D_model]`` or ``[B, T, D_model]`` (the B sequences decoded
independently, as :func:`causal_attention` takes them; the two batch strategies
take ``[B, T, D_model]`` only), ``w_q, w_k: [D_model, D_k]``, ``w_v: [D_model,
D_v]``, float32 or float64; the output ``[..., T, D_v]`` is in ``np.result_type``
of the inputs. At step t:
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

``check_finite`` (keyword, default True): the checks that read every element (NaN/inf
in x and the weights, the overflow bound with a given cache's stored keys, the output)
run once per call; ``check_finite=False`` skips them (a given cache's own ``update``
still checks what it is given). The type, dtype, shape and cache checks always run.
"""

import functools

import numpy as np

from ._validation import as_flag, check_finite_output, check_score_range
from .attention import attend, causal_attention, check_projection_inputs
from .cache import DynamicCache, StaticCache, as_cache, check_cache_fits, rolled_back_on_error


def check_decode_inputs(x, w_q, w_k, w_v, x_ndims, cache, check_finite, **window):
    """Validate a decode's ``x``, weights and given ``cache`` (None: the decode makes its own).

    Returns ``(x, w_q, w_k, w_v, dtype, cache)``, the cache as a :class:`Cache`
    (:func:`~kv_attention.cache.as_cache`). The type, dtype, shape and cache checks
    always run; with ``check_finite`` the one scan of the call (NaN/inf and the
    overflow bound, the cache's stored keys included) follows them. ``window``:
    the call's ``window`` and ``n_sink``, which a given cache must keep.
    """
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims, check_finite=False)
    stored_k = None
    if cache is not None:
        cache = as_cache(cache)
        stored_k = check_cache_fits(cache, x, w_k, w_v, dtype, **window)
    if check_finite:
        check_score_range(x, w_q, w_k, w_v, dtype, stored_k)
    return x, w_q, w_k, w_v, dtype, cache


# The decode loop


def _decode(x, w_q, w_k, w_v, cache, update):
    """The decode loop over validated ``x: [..., T, D_model]`` through ``cache``, writing with ``update``.

    Bare, for a cache the decode made (``update`` its ``update`` with ``check_finite=False``): its
    positions come from validated inputs, and the overflow guard proves every
    score and output finite. A caller's cache goes through :func:`_decode_given`.
    """
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=np.result_type(x, w_v))  # [..., T, D_v]
    for t in range(x.shape[-2]):
        x_t = x[..., t : t + 1, :]  # [..., 1, D_model]
        k, v = update(x_t @ w_k, x_t @ w_v)  # [..., t+1, D_k], [..., t+1, D_v]
        out[..., t : t + 1, :] = attend(x_t @ w_q, k, v, check_finite=False)  # [..., 1, D_v]
    return out


def _decode_given(x, w_q, w_k, w_v, cache, check_finite):
    """:func:`_decode` through a caller's ``cache``, once it is known to be a Cache that fits.

    Written through its own ``update()``; the positions it already held (never
    ours to check) may hold anything, so the output is checked (``check_finite``),
    and on any error the cache is cropped back to its length.
    """
    with rolled_back_on_error(cache), np.errstate(over="ignore", invalid="ignore"):
        out = _decode(x, w_q, w_k, w_v, cache, cache.update)
        if check_finite:
            check_finite_output(out)
    return out


def _decode_cached(x, w_q, w_k, w_v, cache, check_finite):
    """The concat path for validated ``x: [..., T, D_model]``: a new DynamicCache by default."""
    if cache is not None:
        return _decode_given(x, w_q, w_k, w_v, cache, check_finite)
    cache = DynamicCache()
    return _decode(x, w_q, w_k, w_v, cache, functools.partial(cache.update, check_finite=False))


def _decode_preallocated(x, w_q, w_k, w_v, dtype, cache=None, check_finite=True):
    """The preallocated path for validated ``x: [..., T, D_model]``: a StaticCache of T positions by default."""
    if cache is not None:
        return _decode_given(x, w_q, w_k, w_v, cache, check_finite)
    cache = StaticCache(x.shape[:-2], x.shape[-2], w_k.shape[1], w_v.shape[1], dtype)
    return _decode(x, w_q, w_k, w_v, cache, functools.partial(cache.update, check_finite=False))


def decode_without_cache(x, w_q, w_k, w_v, *, check_finite=True):
    """Decode with no cache: step t recomputes causal attention over ``x[..., :t+1, :]``, O(T³) in all.

    What a model without a KV cache does: it re-runs its whole context for every new token.
    """
    check_finite = as_flag("check_finite", check_finite)
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2, 3), check_finite=check_finite)
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=dtype)  # [..., T, D_v]
    for t in range(x.shape[-2]):
        prefix = causal_attention(x[..., : t + 1, :], w_q, w_k, w_v, check_finite=False)  # [..., t+1, D_v]
        out[..., t, :] = prefix[..., -1, :]  # its last row
    if check_finite:
        check_finite_output(out)
    return out


def cached_attention(x, w_q, w_k, w_v, cache=None, *, check_finite=True):
    """Decode with a K/V cache grown by ``np.concatenate`` (default: a new :class:`DynamicCache`)."""
    check_finite = as_flag("check_finite", check_finite)
    x, w_q, w_k, w_v, _, cache = check_decode_inputs(x, w_q, w_k, w_v, (2, 3), cache, check_finite)
    return _decode_cached(x, w_q, w_k, w_v, cache, check_finite)


def cached_attention_preallocated(x, w_q, w_k, w_v, cache=None, *, check_finite=True):
    """Decode with K/V buffers allocated once and written in place (default: a StaticCache of T positions)."""
    check_finite = as_flag("check_finite", check_finite)
    x, w_q, w_k, w_v, dtype, cache = check_decode_inputs(x, w_q, w_k, w_v, (2, 3), cache, check_finite)
    return _decode_preallocated(x, w_q, w_k, w_v, dtype, cache, check_finite)


def sequential_cached_attention(x, w_q, w_k, w_v, *, check_finite=True):
    """Decode B sequences one after another in a Python loop: the batch baseline.

    Each takes the path of :func:`cached_attention_preallocated` (inputs validated
    once for all B), so it differs from :func:`batched_cached_attention` only in
    how many NumPy calls are made.
    """
    check_finite = as_flag("check_finite", check_finite)
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(3,), check_finite=check_finite)
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=dtype)  # [B, T, D_v]
    for b in range(x.shape[0]):
        out[b] = _decode_preallocated(x[b], w_q, w_k, w_v, dtype)  # [T, D_v], validated above
    return out


def batched_cached_attention(x, w_q, w_k, w_v, cache=None, *, check_finite=True):
    """Decode B sequences together, one NumPy call per operation per step.

    The cache is ``[B, T, D]`` (default: a new StaticCache of T positions); every
    matmul keeps B as a batch axis, so sequences never mix.
    """
    check_finite = as_flag("check_finite", check_finite)
    x, w_q, w_k, w_v, dtype, cache = check_decode_inputs(x, w_q, w_k, w_v, (3,), cache, check_finite)
    return _decode_preallocated(x, w_q, w_k, w_v, dtype, cache, check_finite)
