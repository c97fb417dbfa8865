"""Multi-head, grouped-query and multi-query causal attention: the reference and the decode.

Axes: B batch, T positions, S keys attended to, H_q query heads (``n_heads``), H_kv K/V heads (``n_kv_heads``),
G = H_q // H_kv, D_head; ``x: [T, D_model]`` or ``[B, T, D_model]``, ``w_q: [D_model, H_q·D_head]``,
``w_k, w_v: [D_model, H_kv·D_head]``, ``w_o: [H_q·D_head, D_out]`` -> ``[..., T, D_out]`` in the inputs'
result_type, scale 1/sqrt(D_head). Errors as attention.py's, raised before anything is written.

MHA (H_kv = H_q): Vaswani et al. 2017; MQA (H_kv = 1): Shazeer 2019; GQA: Ainslie et al. 2023. Query head h
reads K/V head ``h // G``, the order of Llama's ``repeat_kv`` (repeat-interleave) and FlashAttention's GQA.
"""

import functools

import numpy as np

from ._validation import as_array, as_flag, as_size, check_choice, check_finite_array
from .attention import attention_forward, causal_attention, check_weight
from .cache import StaticCache, check_cache_fits
from .split import as_num_splits, split_kv_attention

PATHS = ("repeat_kv", "grouped")


# Checks of the head counts, x and the four weights, and a given cache


def check_head_counts(n_heads, n_kv_heads):
    """Return ``(n_heads, n_kv_heads)`` as ints >= 1, with n_heads a multiple of n_kv_heads."""
    n_heads = as_size("n_heads", n_heads, minimum=1)
    n_kv_heads = as_size("n_kv_heads", n_kv_heads, minimum=1)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}: "
                         "every K/V head must serve the same number of query heads")
    return n_heads, n_kv_heads


def _head_dim(w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """D_head = ``w_q.shape[1] // n_heads``; ValueError unless every weight's width is heads × D_head."""
    head_dim, rest = divmod(w_q.shape[1], n_heads)
    if rest or head_dim == 0:
        raise ValueError(f"w_q has {w_q.shape[1]} columns, which is not n_heads={n_heads} × head_dim "
                         f"for any head_dim >= 1: w_q {w_q.shape}")
    for name, w in (("w_k", w_k), ("w_v", w_v)):
        if w.shape[1] != n_kv_heads * head_dim:
            raise ValueError(f"{name} has {w.shape[1]} columns but n_kv_heads × head_dim = {n_kv_heads} × {head_dim} "
                             f"= {n_kv_heads * head_dim} (head_dim from w_q {w_q.shape}, n_heads={n_heads}): "
                             f"{name} {w.shape}")
    if w_o.shape[0] != n_heads * head_dim:
        raise ValueError(f"w_o has {w_o.shape[0]} rows but n_heads × head_dim = {n_heads} × {head_dim} "
                         f"= {n_heads * head_dim}: w_o {w_o.shape}")
    return head_dim


def check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads, check_finite=True):
    """``(x, w_q, w_k, w_v, w_o, head_dim, dtype)``, the weights in ``dtype``, the five's result_type."""
    arrays = {name: as_array(name, a) for name, a in zip(("x", "w_q", "w_k", "w_v", "w_o"), (x, w_q, w_k, w_v, w_o))}
    x = arrays["x"]
    if x.ndim not in (2, 3):
        raise ValueError(f"x must be [T, D_model] or [B, T, D_model], got shape {x.shape}")
    for name, w in list(arrays.items())[1:]:
        check_weight(name, w, None if name == "w_o" else x, "a matrix [rows, columns]")
    head_dim = _head_dim(*list(arrays.values())[1:], n_heads, n_kv_heads)
    if check_finite:
        for name, a in arrays.items():
            check_finite_array(name, a)
    dtype = np.result_type(*arrays.values())
    return (x, *(arrays[n].astype(dtype, copy=False) for n in ("w_q", "w_k", "w_v", "w_o")), head_dim, dtype)


# The reference and the decode


def multi_head_attention(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, check_finite=True):
    """The reference: query head h is :func:`causal_attention` with its columns of ``w_q`` and K/V head
    ``h // G``'s of ``w_k``, ``w_v``; the heads concatenated in order and projected by ``w_o``."""
    n_heads, n_kv_heads = check_head_counts(n_heads, n_kv_heads)
    x, w_q, w_k, w_v, w_o, head_dim, dtype = check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads,
                                                               as_flag("check_finite", check_finite))
    group = n_heads // n_kv_heads
    heads = []
    for h in range(n_heads):
        q_cols = slice(h * head_dim, (h + 1) * head_dim)
        kv_cols = slice((h // group) * head_dim, (h // group + 1) * head_dim)  # K/V head h // G
        heads.append(causal_attention(x, w_q[:, q_cols], w_k[:, kv_cols], w_v[:, kv_cols], check_finite=False))
    return np.concatenate(heads, axis=-1) @ w_o  # [..., T, H_q·D_head] -> [..., T, D_out]


def _attend_repeat_kv(q, k, v, attention=None):
    """One step of ``q [..., H_kv, G, D_head]`` over ``k, v [..., H_kv, S, D_head]``, each K/V head repeated G times
    (``[..., H_q, S, D_head]`` copies; none for G = 1), as Llama's ``repeat_kv``."""
    *lead, n_kv_heads, group, head_dim = q.shape
    if group > 1:
        k = np.repeat(k, group, axis=-3)  # [..., H_q, S, D_head], K/V head j -> query heads jG..jG+G-1
        v = np.repeat(v, group, axis=-3)  # [..., H_q, S, D_head]
    q = q.reshape((*lead, n_kv_heads * group, 1, head_dim))  # [..., H_q, 1, D_head]
    return (attention or attention_forward)(q, k, v)  # [..., H_q, 1, D_head]


def _attend_grouped(q, k, v, attention=None):
    """One step on the cache's views, a group's G query heads as G rows: one ``[G, D_head] x [D_head, S]`` product a
    K/V head, FlashAttention-2's layout for one query position (``seqlenq_ngroups_swapped``, ``flash_api.cpp``)."""
    return (attention or attention_forward)(q, k, v)  # scores [..., H_kv, G, S] -> [..., H_kv, G, D_head]


_STEPS = {"repeat_kv": _attend_repeat_kv, "grouped": _attend_grouped}


def _decode_heads(x, w_q, w_k, w_v, w_o, n_kv_heads, head_dim, step, update):
    """The decode loop over validated ``x: [..., T, D_model]``, writing each step's K/V with ``update``."""
    lead = x.shape[:-2]
    group = w_q.shape[1] // (n_kv_heads * head_dim)
    q_shape = lead + (n_kv_heads, group, head_dim)  # [..., H_kv, G, D_head]
    kv_shape = lead + (n_kv_heads, 1, head_dim)  # [..., H_kv, 1, D_head]
    heads_shape = lead + (w_q.shape[1],)  # [..., H_q·D_head], head h at columns h·D_head..
    out = np.empty(lead + (x.shape[-2], w_o.shape[1]), dtype=np.result_type(x, w_o))  # [..., T, D_out]
    for t in range(x.shape[-2]):
        x_t = x[..., t, :]  # [..., D_model]
        k, v = update((x_t @ w_k).reshape(kv_shape), (x_t @ w_v).reshape(kv_shape))  # [..., H_kv, t+1, D_head]
        heads = step((x_t @ w_q).reshape(q_shape), k, v)  # [..., H_kv, G, D_head] or [..., H_q, 1, D_head]
        out[..., t, :] = heads.reshape(heads_shape) @ w_o  # [..., D_out]
    return out


def multi_head_decode(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, path="grouped", cache=None, num_splits=None,
                      check_finite=True):
    """Decode token by token, equal to :func:`multi_head_attention` position by position: step t projects
    ``x[..., t, :]``, stores its H_kv keys and values, and its H_q queries attend over positions 0..t.

    ``path``: ``"repeat_kv"`` (each K/V head repeated G times a step, Llama's, gpt-fast's) or ``"grouped"``
    (default: a group's G query heads as G rows over their K/V head's view, no copy). ``cache``: a Cache of
    ``[*x.shape[:-2], H_kv, T_max, D_head]`` with room for T more (its positions attended to; default a new
    StaticCache). ``num_splits``: each head attends in that many parts merged by log-sum-exp (flash-decoding).
    """
    check_choice("path", path, PATHS)
    step = _STEPS[path]
    if num_splits is not None:
        attention = functools.partial(split_kv_attention, num_splits=as_num_splits(num_splits), check_finite=False)
        step = functools.partial(step, attention=attention)
    n_heads, n_kv_heads = check_head_counts(n_heads, n_kv_heads)
    x, w_q, w_k, w_v, w_o, head_dim, dtype = check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads,
                                                               as_flag("check_finite", check_finite))
    kv_shape = x.shape[:-2] + (n_kv_heads, head_dim)
    if cache is not None:
        update = check_cache_fits(cache, (kv_shape, kv_shape), x.shape[-2], dtype).update
    else:
        cache = StaticCache(x.shape[:-2] + (n_kv_heads,), x.shape[-2], head_dim, head_dim, dtype)
        update = cache._append  # its own cache: k, v from checked inputs, and room for T
    return _decode_heads(x, w_q, w_k, w_v, w_o, n_kv_heads, head_dim, step, update)

