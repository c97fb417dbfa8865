"""Token-by-token decode strategies, each exact against :func:`causal_attention`.

Decode contract: at step t no strategy reads ``x[..., t+1:, :]``; the cached
strategies read only ``x[..., t, :]`` and their cache, and none projects the
whole of ``x`` up front (that would be prefill, not decode).

Shapes at decode step t (B = batch, D = feature width):
    x_t      [..., 1, D_model]      q_t      [..., 1, D_k]
    k_cache  [..., t+1, D_k]        scores   [..., 1, t+1]
    v_cache  [..., t+1, D_v]        out_t    [..., 1, D_v]
"""

import numpy as np

from ._validation import check_cache_fits, check_finite_output, check_projection_inputs
from .attention import _causal_attention, attend
from .cache import DynamicCache, StaticCache, check_is_cache, rolled_back_on_error


def _decode(x, w_q, w_k, w_v, cache):
    """Run the decode loop over ``x: [..., T, D_model]`` through ``cache``.

    On any error the cache is cropped back to the length it had, so a failed
    call leaves a caller's cache unchanged.
    """
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=np.result_type(x, w_v))  # [..., T, D_v]
    check_is_cache(cache)
    check_cache_fits(cache, x, w_q, w_k, w_v, out.dtype)
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
    return _decode(x, w_q, w_k, w_v, cache)


def decode_without_cache(x, w_q, w_k, w_v):
    """Decode with no cache: at step t recompute causal attention over ``x[:t+1]``.

    This is what a model without a KV cache does: it re-runs its whole context
    for every new token and keeps only the last position's output. O(T³) work.

    Args:
        x: ``[T, D_model]``, float32 or float64.
        w_q: ``[D_model, D_k]``. w_k: ``[D_model, D_k]``. w_v: ``[D_model, D_v]``.

    Returns:
        ``[T, D_v]`` in ``np.result_type`` of the inputs.

    Raises:
        TypeError: an input is not a float32/float64 array.
        ValueError: shapes that do not fit (named in the message), NaN/inf in an
            input, or scores that overflow the dtype.
    """
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2,))
    out = np.empty((x.shape[0], w_v.shape[1]), dtype=dtype)  # [T, D_v]
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(x.shape[0]):
            out[t] = _causal_attention(x[: t + 1], w_q, w_k, w_v)[-1]  # prefix [t+1, D_v] -> last row
    check_finite_output(out)
    return out


def cached_attention(x, w_q, w_k, w_v, cache=None):
    """Decode one sequence with a K/V cache grown by ``np.concatenate``.

    At step t only the new token's q/k/v are computed; K and V grow by one
    position through :class:`DynamicCache` (Hugging Face's "dynamic cache").

    Args:
        x: ``[T, D_model]``, float32 or float64.
        w_q: ``[D_model, D_k]``. w_k: ``[D_model, D_k]``. w_v: ``[D_model, D_v]``.
        cache: optional :class:`DynamicCache` (or any cache with the same
            interface) to append to; positions already in it are attended to,
            as after a prefill. Default: a new empty DynamicCache.

    Returns:
        ``[T, D_v]`` in ``np.result_type`` of the inputs.

    Raises:
        TypeError: an input is not a float32/float64 array, or ``cache`` is not a
            cache or holds another dtype than the computation's.
        ValueError: shapes that do not fit (named in the message), NaN/inf in an
            input, a ``cache`` that does not fit or is too short, or scores that
            overflow the dtype. A given ``cache`` is left unchanged.
    """
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2,))
    return _decode(x, w_q, w_k, w_v, DynamicCache() if cache is None else cache)


def cached_attention_preallocated(x, w_q, w_k, w_v, cache=None):
    """Decode one sequence with K/V buffers allocated once and written in place.

    Args:
        x: ``[T, D_model]``, float32 or float64.
        w_q: ``[D_model, D_k]``. w_k: ``[D_model, D_k]``. w_v: ``[D_model, D_v]``.
        cache: optional :class:`StaticCache` with ``batch_shape=()`` and room for
            T more positions. Default: a new StaticCache of exactly T positions.

    Returns:
        ``[T, D_v]`` in ``np.result_type`` of the inputs.

    Raises:
        TypeError: an input is not a float32/float64 array, or ``cache`` is not a
            cache or holds another dtype than the computation's.
        ValueError: shapes that do not fit (named in the message), NaN/inf in an
            input, a ``cache`` that does not fit or is too short, or scores that
            overflow the dtype. A given ``cache`` is left unchanged.
    """
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2,))
    return _decode_preallocated(x, w_q, w_k, w_v, cache)


def sequential_cached_attention(x, w_q, w_k, w_v):
    """Decode B sequences one after another in a Python loop: the batch baseline.

    Each sequence goes through the decode path of
    :func:`cached_attention_preallocated` with its own preallocated cache
    (inputs validated once for all B), so the only difference from
    :func:`batched_cached_attention` is how many NumPy calls are made.

    Args:
        x: ``[B, T, D_model]``, float32 or float64.
        w_q: ``[D_model, D_k]``. w_k: ``[D_model, D_k]``. w_v: ``[D_model, D_v]``.

    Returns:
        ``[B, T, D_v]`` in ``np.result_type`` of the inputs.

    Raises:
        TypeError: an input is not a float32/float64 array.
        ValueError: shapes that do not fit (named in the message), NaN/inf in an
            input, or scores that overflow the dtype.
    """
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(3,))
    out = np.empty(x.shape[:-1] + (w_v.shape[1],), dtype=dtype)  # [B, T, D_v]
    for b in range(x.shape[0]):
        out[b] = _decode_preallocated(x[b], w_q, w_k, w_v)  # [T, D_v], validated above
    return out


def batched_cached_attention(x, w_q, w_k, w_v, cache=None):
    """Decode B sequences together: one NumPy call per operation per step.

    The cache is ``k_cache: [B, T, D_k]``, ``v_cache: [B, T, D_v]``,
    preallocated. Every matmul keeps B as a batch axis, so sequences never mix.

    Args:
        x: ``[B, T, D_model]``, float32 or float64.
        w_q: ``[D_model, D_k]``. w_k: ``[D_model, D_k]``. w_v: ``[D_model, D_v]``.
        cache: optional :class:`StaticCache` with ``batch_shape=(B,)`` and room
            for T more positions. Default: a new one of exactly T positions.

    Returns:
        ``[B, T, D_v]`` in ``np.result_type`` of the inputs.

    Raises:
        TypeError: an input is not a float32/float64 array, or ``cache`` is not a
            cache or holds another dtype than the computation's.
        ValueError: shapes that do not fit (named in the message), NaN/inf in an
            input, a ``cache`` that does not fit or is too short, or scores that
            overflow the dtype. A given ``cache`` is left unchanged.
    """
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(3,))
    return _decode_preallocated(x, w_q, w_k, w_v, cache)

