"""Single-head scaled dot-product attention: the causal reference, its banded mask and one step, masked or not.

softmax(q kᵀ / sqrt(D_k) + mask) v (Vaswani et al. 2017, 3.2.1). Axes: B batch, T positions, S keys attended to,
D widths (D_model, D_k, D_v); leading ``...`` axes are batch-like. Inputs are float32 or float64, computed in their
``np.result_type``; k and v may be bfloat16/float16 storage, read upcast. TypeError for a non-float array,
ValueError for shapes that do not fit; ``check_finite`` (default True) scans for NaN/inf as ``scipy.linalg`` does.
:func:`attention_forward` is the one composition every module calls (HF's ``eager_attention_forward``).

:func:`band_mask`: t attends to s when s <= t and either t - s < window or s < n_sink (``window`` counts the query's
own key): FlashAttention's ``window_size=(W - 1, 0)``, HF's ``sliding_window=W``, and StreamingLLM's sinks
(Xiao et al. 2023), which neither has. ``window=None`` is full causal attention.
"""

import math

import numpy as np

from ._validation import as_array, as_flag, as_size, check_finite_array

_X_LAYOUTS = {2: "[T, D_model]", 3: "[B, T, D_model]"}


def check_projection_inputs(x, w_q, w_k, w_v, x_ndims, check_finite=True):
    """``(x, w_q, w_k, w_v, dtype)``, weights ``[D_model, D_k | D_k | D_v]`` in ``dtype``, the four's result_type."""
    x, w_q, w_k, w_v = (as_array(n, a) for n, a in (("x", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v)))
    if x.ndim not in x_ndims:
        raise ValueError(f"x must be {' or '.join(_X_LAYOUTS[n] for n in x_ndims)}, got shape {x.shape}")
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        check_weight(name, w, x)
    if w_q.shape[1] != w_k.shape[1]:
        raise ValueError(f"w_q and w_k must share D_k: w_q {w_q.shape}, w_k {w_k.shape}")
    if w_q.shape[1] == 0:
        raise ValueError(f"D_k must be at least 1: w_q {w_q.shape}")
    if check_finite:
        for name, a in (("x", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
            check_finite_array(name, a)
    dtype = np.result_type(x, w_q, w_k, w_v)
    return x, w_q.astype(dtype, copy=False), w_k.astype(dtype, copy=False), w_v.astype(dtype, copy=False), dtype


def check_weight(name, w, x, layout="[D_model, D]"):
    """Raise ValueError unless ``w`` is a matrix of D_model rows (``x: [..., D_model]``; None: any rows)."""
    if w.ndim != 2:
        raise ValueError(f"{name} must be {layout}, got shape {w.shape}")
    if x is not None and w.shape[0] != x.shape[-1]:
        raise ValueError(f"{name} has {w.shape[0]} rows but x has D_model={x.shape[-1]}: x {x.shape}, {name} {w.shape}")


def check_window(window, n_sink):
    """``(window, n_sink)`` as ints: ``window`` None or >= 1, ``n_sink`` >= 0."""
    return (None if window is None else as_size("window", window, minimum=1)), as_size("n_sink", n_sink)


def check_attention_inputs(q, k, v, check_finite=True):
    """``(q [..., T_q, D_k], k [..., S, D_k], v [..., S, D_v], dtype)``, each in their result_type (2-byte k, v
    upcast)."""
    q, k, v = as_array("q", q), as_array("k", k, storage=True), as_array("v", v, storage=True)
    if not (q.ndim >= 2 and k.ndim == v.ndim == q.ndim and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and k.shape[-1] == q.shape[-1] > 0 and v.shape[-2] == k.shape[-2]):
        shapes = f"q {q.shape}, k {k.shape}, v {v.shape}"
        if q.ndim < 2 or not k.ndim == v.ndim == q.ndim or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
            raise ValueError(f"q, k and v must be [..., T_q, D_k], [..., S, D_k] and [..., S, D_v] "
                             f"with the same leading axes, got {shapes}")
        if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
            raise ValueError(f"q and k must share D_k, and k and v the S axis: {shapes}")
        raise ValueError(f"D_k must be at least 1: {shapes}")
    if check_finite:
        for name, a in (("q", q), ("k", k), ("v", v)):
            check_finite_array(name, a)
    dtype = np.result_type(q, k, v)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False), dtype


def as_key_mask(valid, k):
    """``valid`` as a bool array ``[..., S]``, k's shape without D_k; TypeError or ValueError."""
    expected = f"[..., S] = {list(k.shape[:-1])} for k {k.shape}"
    if valid is None or isinstance(valid, np.ma.MaskedArray):
        raise TypeError(f"valid must be a bool array {expected}, got {'None' if valid is None else 'a masked array'}")
    valid = np.asarray(valid)
    if valid.dtype != np.bool_:
        raise TypeError(f"valid must be a bool array, got dtype {valid.dtype}")
    if valid.shape != k.shape[:-1]:
        raise ValueError(f"valid must be {expected}, got shape {valid.shape}")
    return valid


def scaled_scores(q, k):
    """q kᵀ / sqrt(D_k) of ``q: [..., T_q, D_k]`` and ``k: [..., S, D_k]``: ``[..., T_q, S]``."""
    scores = q @ k.swapaxes(-1, -2)  # [..., T_q, S]
    scores *= 1.0 / math.sqrt(q.shape[-1])
    return scores


def attention_weights(scores, mask=None, return_lse=True):
    """``(weights, lse)`` of ``scores [..., T_q, S]``: the softmax over the keys ``mask`` allows, and its
    natural log-sum-exp ``[..., T_q]`` (None unless ``return_lse``). ``mask``: None (every key), or bool
    broadcasting to the scores, True where a query may attend a key. The row maximum is subtracted first, so
    no exp overflows; a masked key gets weight exactly 0 whatever its score; a row with no key (S = 0, or all
    masked) gets weights 0 and lse -inf, the identity of the split-KV merge. Overwrites ``scores``."""
    some_row_empty = mask is not None or scores.shape[-1] == 0
    if mask is not None:
        np.copyto(scores, -np.inf, where=~mask)  # in place: a [T_q, S] mask of a chunk needs no [..., T_q, S] copy
    if some_row_empty:
        top = scores.max(axis=-1, keepdims=True, initial=-np.inf)  # [..., T_q, 1]; -inf for a row with no key
        top[np.isneginf(top)] = 0.0  # exp(-inf - 0) = 0, never NaN
    else:
        top = scores.max(axis=-1, keepdims=True)  # [..., T_q, 1]
    weights = np.exp(np.subtract(scores, top, out=scores), out=scores)  # [..., T_q, S]: the largest 1
    total = weights.sum(axis=-1, keepdims=True)  # [..., T_q, 1]; 0 only for a row with no key
    lse = None
    if return_lse:
        with np.errstate(divide="ignore"):
            lse = (top + np.log(total))[..., 0]  # [..., T_q]; -inf for a row with no key
    weights /= np.where(total > 0, total, 1.0) if some_row_empty else total
    return weights, lse


def attention_forward(q, k, v, mask=None, *, return_lse=False):
    """``out [..., T_q, D_v]`` (with ``return_lse``, ``(out, lse [..., T_q])``) of checked ``q [..., T_q, D_k]``,
    ``k [..., S, D_k]``, ``v [..., S, D_v]`` of one dtype and ``mask`` as :func:`attention_weights` takes it. A masked
    key's value gets weight exactly 0 even if NaN or inf. HF's ``eager_attention_forward`` without dropout, a bool
    mask, and the lse a split-KV merge needs (FlashAttention's ``softmax_lse``).
    """
    if mask is None:
        weights, lse = attention_weights(scaled_scores(q, k), None, return_lse)  # [..., T_q, S]
    else:
        if not np.isfinite(v).all():  # 0 · NaN would be NaN: a value no query attends is taken as 0
            v = np.where(np.any(mask, axis=-2)[..., None], v, 0.0).astype(v.dtype, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):  # a masked key may hold anything
            weights, lse = attention_weights(scaled_scores(q, k), mask, return_lse)  # [..., T_q, S]
    out = weights @ v  # [..., T_q, S] -> [..., T_q, D_v]
    return (out, lse) if return_lse else out


def attend(q, k, v, *, check_finite=True):
    """softmax(q kᵀ / sqrt(D_k)) v, ``[..., T_q, D_v]``: ``q [..., T_q, D_k]`` over every key of ``k [..., S, D_k]``,
    ``v [..., S, D_v]`` (a decode step's keys need no causal mask). S = 0 gives zeros."""
    q, k, v, _ = check_attention_inputs(q, k, v, as_flag("check_finite", check_finite))
    return attention_forward(q, k, v)  # [..., T_q, D_v]


def masked_attend(q, k, v, valid, *, check_finite=True):
    """:func:`attend` over the keys ``valid [..., S]`` (bool) marks True: a masked key gets weight exactly 0 whatever
    it holds; a row with no valid key gives zeros. ``check_finite`` scans q and the valid keys and values."""
    check_finite = as_flag("check_finite", check_finite)
    q, k, v, _ = check_attention_inputs(q, k, v, check_finite=False)
    valid = as_key_mask(valid, k)
    if check_finite:
        check_finite_array("q", q)
        check_finite_array("k at a valid key", k[valid])
        check_finite_array("v at a valid key", v[valid])
    return attention_forward(q, k, v, valid[..., None, :])  # [..., T_q, D_v]


def band_mask(q_positions, k_positions, window=None, n_sink=0):
    """``[T_q, S]`` bool, True where query position ``q_positions[i]`` may attend key position ``k_positions[j]``."""
    t, s = q_positions[:, None], k_positions[None, :]  # [T_q, 1], [1, S]
    allowed = s <= t  # [T_q, S]
    if window is not None:
        allowed &= (t - s < window) | (s < n_sink)
    return allowed


def causal_attention(x, w_q, w_k, w_v, *, window=None, n_sink=0, check_finite=True):
    """The reference every decode reproduces: ``x [T, D_model]`` or ``[B, T, D_model]``, ``w_q, w_k [D_model, D_k]``,
    ``w_v [D_model, D_v]`` -> ``[..., T, D_v]``; t attends to 0..t, or with ``window``/``n_sink`` to the band."""
    window, n_sink = check_window(window, n_sink)
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, (2, 3), as_flag("check_finite", check_finite))
    t_len = x.shape[-2]
    if t_len == 0:
        return np.empty(x.shape[:-1] + w_v.shape[1:], dtype)  # [..., 0, D_v]
    positions = np.arange(t_len)
    return attention_forward(x @ w_q, x @ w_k, x @ w_v, band_mask(positions, positions, window, n_sink))
