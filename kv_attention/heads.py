"""Multi-head, grouped-query and multi-query causal attention: the reference and the decode.

Axis letters used in names and shape comments:
    B     batch (independent sequences)      T      sequence length (positions)
    S     key positions attended to          H_q    query heads (``n_heads``)
    H_kv  K/V heads (``n_kv_heads``)         G      group size, ``n_heads // n_kv_heads``
    D_model  model width                     D_head per-head width (``head_dim``)
    D_out    output width of ``w_o`` (D_model in a transformer layer)
Leading ``...`` axes are batch-like and never mixed.

Multi-head attention (MHA, H_kv = H_q) is Vaswani et al. 2017, section 3.2.2;
multi-query attention (MQA, H_kv = 1) is Shazeer 2019, "Fast Transformer Decoding:
One Write-Head is All You Need"; grouped-query attention (GQA, 1 < H_kv < H_q) is
Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models".

Head mapping: query head h reads K/V head ``h // G``, so consecutive query heads
share a K/V head. This is the order of the Llama reference code's ``repeat_kv``
(``expand`` then ``reshape``, i.e. repeat-interleave) and of FlashAttention's GQA;
``h % H_kv`` would be a different, wrong model.
"""

import numpy as np

from ._validation import (
    check_choice,
    check_finite_output,
    check_head_cache_fits,
    check_head_counts,
    check_head_inputs,
)
from .attention import _causal_attention, attend
from .cache import StaticCache, check_is_cache, rolled_back_on_error

PATHS = ("repeat_kv", "grouped")


def multi_head_attention(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads):
    """Causal multi-head attention over the whole sequence at once: the reference.

    Each query head h is the single-head reference :func:`causal_attention` with
    its own columns of ``w_q`` and the columns of K/V head ``h // G`` in ``w_k``
    and ``w_v``; the H_q head outputs are concatenated in head order and
    projected by ``w_o``. Scale 1/sqrt(D_head). With ``n_heads = n_kv_heads = 1``
    and ``w_o`` the identity this is :func:`causal_attention`.

    Args:
        x: ``[T, D_model]`` or ``[B, T, D_model]``, float32 or float64.
        w_q: ``[D_model, H_q·D_head]``. w_k, w_v: ``[D_model, H_kv·D_head]``.
        w_o: ``[H_q·D_head, D_out]`` (D_out = D_model in a transformer layer).
        n_heads: H_q >= 1. n_kv_heads: H_kv >= 1, dividing n_heads (H_kv = H_q
            is MHA, 1 is MQA, in between GQA).

    Returns:
        ``[T, D_out]`` or ``[B, T, D_out]`` in ``np.result_type`` of the inputs.
        T = 0 gives an empty array.

    Raises:
        TypeError: an input is not a float32/float64 array, or a head count is not an integer.
        ValueError: n_heads not divisible by n_kv_heads, a count < 1, shapes that
            do not fit (named in the message), NaN/inf in an input, or overflow.
    """
    n_heads, n_kv_heads = check_head_counts(n_heads, n_kv_heads)
    x, w_q, w_k, w_v, w_o, head_dim, _ = check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads)
    group = n_heads // n_kv_heads
    heads = []
    with np.errstate(over="ignore", invalid="ignore"):
        for h in range(n_heads):
            q_cols = slice(h * head_dim, (h + 1) * head_dim)
            kv_cols = slice((h // group) * head_dim, (h // group + 1) * head_dim)  # K/V head h // G
            head = _causal_attention(x, w_q[:, q_cols], w_k[:, kv_cols], w_v[:, kv_cols])  # [..., T, D_head]
            heads.append(head)
        out = np.concatenate(heads, axis=-1) @ w_o  # [..., T, H_q·D_head] -> [..., T, D_out]
    check_finite_output(out)
    return out


def _attend_repeat_kv(q, k, v):
    """One decode step by repeating each K/V head G times, as Llama's ``repeat_kv`` does.

    Args:
        q: ``[..., H_kv, G, D_head]``, the new position's queries by group.
        k, v: ``[..., H_kv, S, D_head]``, the cache's views.

    Returns:
        ``[..., H_q, 1, D_head]``. For G > 1 each step materialises
        ``[..., H_q, S, D_head]`` copies of K and V; for G = 1 (MHA) it uses the
        cache's views, as ``repeat_kv`` returns its input when ``n_rep == 1``.
    """
    *lead, n_kv_heads, group, head_dim = q.shape
    if group > 1:
        k = np.repeat(k, group, axis=-3)  # [..., H_q, S, D_head], K/V head j -> query heads jG..jG+G-1
        v = np.repeat(v, group, axis=-3)  # [..., H_q, S, D_head]
    q = q.reshape((*lead, n_kv_heads * group, 1, head_dim))  # [..., H_q, 1, D_head]
    return attend(q, k, v)  # [..., H_q, 1, D_head]


def _attend_grouped(q, k, v):
    """One decode step on the cache's own views: the G query heads of a group are G query rows.

    Args:
        q: ``[..., H_kv, G, D_head]``, the new position's queries by group.
        k, v: ``[..., H_kv, S, D_head]``, the cache's views; never copied.

    Returns:
        ``[..., H_kv, G, D_head]``: one ``[G, D_head] x [D_head, S]`` product per
        K/V head instead of G products against G copies. FlashAttention-2 does the
        same for one query position (``seqlenq_ngroups_swapped`` in its
        ``flash_api.cpp``: q ``(b, 1, H_kv·G, d)`` viewed as ``(b, G, H_kv, d)``).
    """
    return attend(q, k, v)  # scores [..., H_kv, G, S] -> [..., H_kv, G, D_head]


_STEPS = {"repeat_kv": _attend_repeat_kv, "grouped": _attend_grouped}


def _decode_heads(x, w_q, w_k, w_v, w_o, n_kv_heads, head_dim, step, cache):
    """The decode loop over validated ``x: [..., T, D_model]``; on any error ``cache`` is cropped back."""
    lead = x.shape[:-2]
    group = w_q.shape[1] // (n_kv_heads * head_dim)
    q_shape = lead + (n_kv_heads, group, head_dim)  # [..., H_kv, G, D_head]
    kv_shape = lead + (n_kv_heads, 1, head_dim)  # [..., H_kv, 1, D_head]
    heads_shape = lead + (w_q.shape[1],)  # [..., H_q·D_head], head h at columns h·D_head..
    out = np.empty(lead + (x.shape[-2], w_o.shape[1]), dtype=np.result_type(x, w_o))  # [..., T, D_out]
    with rolled_back_on_error(cache), np.errstate(over="ignore", invalid="ignore"):
        for t in range(x.shape[-2]):
            x_t = x[..., t, :]  # [..., D_model]
            k_t = (x_t @ w_k).reshape(kv_shape)  # [..., H_kv, 1, D_head]
            v_t = (x_t @ w_v).reshape(kv_shape)  # [..., H_kv, 1, D_head]
            k, v = cache.update(k_t, v_t)  # views [..., H_kv, t+1, D_head]
            q_t = (x_t @ w_q).reshape(q_shape)  # [..., H_kv, G, D_head]
            heads = step(q_t, k, v)  # [..., H_kv, G, D_head] or [..., H_q, 1, D_head]
            out[..., t, :] = heads.reshape(heads_shape) @ w_o  # [..., D_out]
        check_finite_output(out)
    return out


def multi_head_decode(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, path="grouped", cache=None):
    """Decode token by token with a preallocated ``[B, H_kv, T_max, D_head]`` K/V cache.

    At step t only ``x[..., t, :]`` is projected: its H_kv new keys and values
    are written into the cache (:class:`StaticCache`, leading axes ``(B, H_kv)``),
    and its H_q queries attend over the cache's first t+1 positions. Equals
    :func:`multi_head_attention` position by position.

    Two paths, the same result up to rounding (about 1e-16 in float64):
        ``"repeat_kv"``: repeat each K/V head G times into ``[..., H_q, S, D_head]``
        per step (the common approach: Llama's ``repeat_kv``, gpt-fast), one
        query row per head.
        ``"grouped"`` (default): attention on ``[..., H_kv, G, ...]`` views, the G
        query heads of a group as G query rows against their K/V head's cache
        view; K/V are never copied.

    Args:
        x: ``[T, D_model]`` or ``[B, T, D_model]``, float32 or float64.
        w_q: ``[D_model, H_q·D_head]``. w_k, w_v: ``[D_model, H_kv·D_head]``.
        w_o: ``[H_q·D_head, D_out]`` (D_out = D_model in a transformer layer).
        n_heads: H_q >= 1. n_kv_heads: H_kv >= 1, dividing n_heads.
        path: ``"grouped"`` or ``"repeat_kv"``.
        cache: optional cache with ``k_cache``/``v_cache`` of
            ``[*x.shape[:-2], H_kv, T_max, D_head]`` and room for T more positions,
            e.g. ``StaticCache((B, n_kv_heads), T_max, head_dim, head_dim)``;
            positions already in it are attended to, as after a prefill.
            Default: a new StaticCache of exactly T positions.

    Returns:
        ``[T, D_out]`` or ``[B, T, D_out]`` in ``np.result_type`` of the inputs.

    Raises:
        TypeError: an input is not a float32/float64 array, a head count is not an
            integer, or ``cache`` is not a cache or holds another dtype.
        ValueError: an unknown ``path``, n_heads not divisible by n_kv_heads, a
            count < 1, shapes that do not fit (named in the message), NaN/inf in
            an input, a ``cache`` that does not fit or is too short, or overflow.
            A given ``cache`` is left unchanged.
    """
    check_choice("path", path, PATHS)
    n_heads, n_kv_heads = check_head_counts(n_heads, n_kv_heads)
    x, w_q, w_k, w_v, w_o, head_dim, dtype = check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads)
    if cache is None:
        cache = StaticCache(x.shape[:-2] + (n_kv_heads,), x.shape[-2], head_dim, head_dim, dtype)
    else:
        check_is_cache(cache)
        check_head_cache_fits(cache, x, w_q, w_k, w_v, n_kv_heads, head_dim, dtype)
    return _decode_heads(x, w_q, w_k, w_v, w_o, n_kv_heads, head_dim, _STEPS[path], cache)
