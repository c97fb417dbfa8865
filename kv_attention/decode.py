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

import numpy as np

from ._validation import as_flag, check_finite_output, check_projection_inputs, check_score_range
from .attention import attend, causal_attention
from .cache import DynamicCache, StaticCache, check_is_cache, rolled_back_on_error


# Checks of a cache given to a decode


def check_cache_fits(cache, x, w_k, w_v, dtype, layout=None, window=None, n_sink=0):
    """Raise unless a given cache fits ``x``'s leading axes, the widths, ``dtype`` and T more positions.

    ``layout`` is ``(expected_k, expected_v, text)``: the shapes ``k_cache`` and
    ``v_cache`` must have without their T axis, and the layout to name in the
    error; by default ``x``'s leading axes with D_k and D_v (single head). A
    cache that keeps only a window must keep the call's ``window`` and ``n_sink``
    (:func:`check_cache_window`). Returns the keys already in the cache
    ``[..., S, D_k]`` (a prefill), which enter the overflow bound of q·k, or None.
    """
    check_cache_window(cache, window, n_sink)
    k_cache, v_cache = getattr(cache, "k_cache", None), getattr(cache, "v_cache", None)
    if k_cache is None:
        return None
    if layout is None:
        layout = (x.shape[:-2] + (w_k.shape[1],), x.shape[:-2] + (w_v.shape[1],),
                  f"vs x {x.shape}, D_k={w_k.shape[1]}, D_v={w_v.shape[1]}")
    expected_k, expected_v, text = layout
    if k_cache.shape[:-2] + k_cache.shape[-1:] != expected_k or v_cache.shape[:-2] + v_cache.shape[-1:] != expected_v:
        raise ValueError(f"cache does not fit x: k_cache {k_cache.shape} and v_cache {v_cache.shape} {text}")
    if k_cache.dtype != dtype:
        raise TypeError(f"cache holds {k_cache.dtype} but the computation is {dtype}")
    stored, room = cache.get_seq_length(), getattr(cache, "max_seq_len", None)
    if room is not None and stored + x.shape[-2] > room:
        raise ValueError(
            f"cache too short: {stored} of max_seq_len={room} positions used, x needs T={x.shape[-2]} more"
        )
    return k_cache[..., :stored, :] if stored else None


def check_cache_window(cache, window, n_sink):
    """Raise unless a cache that keeps a window (it has ``window``, e.g. SlidingWindowCache) keeps ``window`` and ``n_sink``.

    Such a cache has dropped the keys outside its window, so it can serve only a
    call with the same window and sinks; a cache without ``window`` holds every
    position and serves any call.
    """
    kept = getattr(cache, "window", None)
    if kept is None:
        return
    kept_sinks = getattr(cache, "n_sink", 0)
    if (kept, kept_sinks) != (window, n_sink):
        hint = "; full attention needs a cache of every position, e.g. StaticCache" if window is None else ""
        raise ValueError(
            f"cache keeps window={kept}, n_sink={kept_sinks} but the call has window={window}, "
            f"n_sink={n_sink}{hint}"
        )


def check_decode_inputs(x, w_q, w_k, w_v, x_ndims, cache, check_finite, **window):
    """Validate a decode's ``x``, weights and given ``cache`` (None: the decode makes its own).

    Returns ``(x, w_q, w_k, w_v, dtype)``. The type, dtype, shape and cache checks
    always run; with ``check_finite`` the one scan of the call (NaN/inf and the
    overflow bound, the cache's stored keys included) follows them. ``window``:
    the call's ``window`` and ``n_sink``, which a given cache must keep.
    """
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims, check_finite=False)
    stored_k = None
    if cache is not None:
        check_is_cache(cache)
        stored_k = check_cache_fits(cache, x, w_k, w_v, dtype, **window)
    if check_finite:
        check_score_range(x, w_q, w_k, w_v, dtype, stored_k)
    return x, w_q, w_k, w_v, dtype


# The decode loop


def _decode(x, w_q, w_k, w_v, cache, update):
    """The decode loop over validated ``x: [..., T, D_model]`` through ``cache``, writing with ``update``.

    Bare, for a cache the decode made (``update`` its unchecked ``_append``): its
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
    return _decode(x, w_q, w_k, w_v, cache, cache._append)


def _decode_preallocated(x, w_q, w_k, w_v, dtype, cache=None, check_finite=True):
    """The preallocated path for validated ``x: [..., T, D_model]``: a StaticCache of T positions by default."""
    if cache is not None:
        return _decode_given(x, w_q, w_k, w_v, cache, check_finite)
    cache = StaticCache._of(x.shape[:-2], x.shape[-2], w_k.shape[1], w_v.shape[1], dtype)  # sizes from validated inputs
    return _decode(x, w_q, w_k, w_v, cache, cache._append)


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
    x, w_q, w_k, w_v, _ = check_decode_inputs(x, w_q, w_k, w_v, (2, 3), cache, check_finite)
    return _decode_cached(x, w_q, w_k, w_v, cache, check_finite)


def cached_attention_preallocated(x, w_q, w_k, w_v, cache=None, *, check_finite=True):
    """Decode with K/V buffers allocated once and written in place (default: a StaticCache of T positions)."""
    check_finite = as_flag("check_finite", check_finite)
    x, w_q, w_k, w_v, dtype = check_decode_inputs(x, w_q, w_k, w_v, (2, 3), cache, check_finite)
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
    x, w_q, w_k, w_v, dtype = check_decode_inputs(x, w_q, w_k, w_v, (3,), cache, check_finite)
    return _decode_preallocated(x, w_q, w_k, w_v, dtype, cache, check_finite)
