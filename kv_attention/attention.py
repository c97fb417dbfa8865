"""Single-head scaled dot-product attention: the causal reference, its banded mask and one step, masked or not.

Axis letters used in names and shape comments:
    B  batch (independent sequences)     T  sequence length (positions)
    S  key positions attended to         D  feature width (D_model, D_k, D_v)
Leading ``...`` axes are batch-like and never mixed.

:func:`causal_attention` takes ``x: [T, D_model]`` or ``[B, T, D_model]``, ``w_q, w_k:
[D_model, D_k]``, ``w_v: [D_model, D_v]``, float32 or float64, and returns ``[..., T, D_v]``
in ``np.result_type`` of the inputs (float32 only when every input is float32).
:func:`attend` and :func:`masked_attend` are one step on given ``q``, ``k``, ``v``.
Bad input raises TypeError (an input that is not a float32/float64 array) or
ValueError (shapes that do not fit, named in the message; NaN/inf; scores or
outputs that could overflow the dtype, the bound named with its figure).

``check_finite`` (keyword, default True, as in ``scipy.linalg``): the checks that
read every element, run once per call. ``causal_attention`` and ``masked_attend``
scan the inputs for NaN/inf and check the overflow bound before they compute, and
test the output after. ``attend`` checks what it computed instead, so that a decode
step at model shapes reads K and V once, not once more for a scan: every score and
the output must be finite. Any NaN/inf in q, k or v fails that test (NaN
propagates, 0·inf is NaN, and an infinite score gives its row NaN), and so does any
overflow, since a sum that overflows stays infinite; only then are q, k and v
scanned, to name the cause. This is JAX's ``debug_nans`` order: look at the results,
and find the culprit only when one is not finite. With ``check_finite=False`` the
checks are skipped: the type, dtype and shape checks still run, but inputs holding
NaN/inf or too large for the dtype give NaN/inf or a wrong result instead of an
error, and ``masked_attend`` then needs every key and value finite, masked or not.
The library's own decodes pass False after their own single check per call, or
True where attend's check of its results is theirs (``multi_head_decode``).

Method: softmax(q kᵀ / sqrt(D_k) + causal mask) v, from Vaswani et al. 2017,
"Attention Is All You Need", section 3.2.1.

The banded mask (:func:`band_mask`): position t attends to position s when
s <= t and either t - s < window or s < n_sink. ``window`` counts the keys a
query attends to *including its own*: W = 1 attends only to itself, and the
window of position t is t-W+1..t. That is FlashAttention's ``window_size=(W - 1,
0)`` (query i attends to keys i - left .. i + right inclusive, so left = W - 1;
right = 0 is causal) and Hugging Face's ``sliding_window=W`` (``masking_utils.
sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``; vLLM passes the
same W to FlashAttention as ``(W - 1, 0)``). The first ``n_sink`` positions are
always attended, the attention sinks of StreamingLLM (Xiao et al. 2023,
"Efficient Streaming Language Models with Attention Sinks"). ``window=None``
is full causal attention, and ``n_sink`` then changes nothing. ``window`` is None
or an integer >= 1 and ``n_sink`` an integer >= 0, else TypeError or ValueError.
"""

import math

import numpy as np

from ._validation import (
    _FAST_LIMIT_SQUARED,
    _FLOAT32,
    _FLOAT64,
    _as_array,
    _log10_max_norm,
    _vdot,
    NonFiniteError,
    all_finite,
    as_flag,
    as_size,
    check_finite_output,
    check_score_range,
    raise_if_too_large,
    sum_of_squares,
)


# Checks of x and the projection weights (every mechanism that projects x: decode, heads, ragged, serve)

_X_LAYOUTS = {2: "[T, D_model]", 3: "[B, T, D_model]"}
_WEIGHT_NAMES = ("w_q", "w_k", "w_v", "w_o")


def _check_shapes(x, weights, x_ndims, matrix):
    """Raise ValueError unless x has ``x_ndims`` axes and each weight is 2-D with D_model rows (w_o: any rows)."""
    if x.ndim not in x_ndims:
        layouts = " or ".join(_X_LAYOUTS[n] for n in x_ndims)
        raise ValueError(f"x must be {layouts}, got shape {x.shape}")
    for name, w in zip(_WEIGHT_NAMES, weights):
        if w.ndim != 2:
            raise ValueError(f"{name} must be {matrix}, got shape {w.shape}")
        if w.shape[0] != x.shape[-1] and name != "w_o":
            raise ValueError(f"{name} has {w.shape[0]} rows but x has D_model={x.shape[-1]}: x {x.shape}, {name} {w.shape}")


def check_projection_inputs(x, w_q, w_k, w_v, x_ndims, check_finite=True):
    """Validate ``x`` (``x_ndims`` axes, e.g. ``(2,)`` or ``(2, 3)``) and single-head weights.

    Returns ``(x, w_q, w_k, w_v, dtype)``, the weights in ``dtype``. ValueError also
    for D_k of w_q != D_k of w_k, or D_k == 0. Written for speed (it runs on every
    decode call): one test of the types and dtypes, one of every shape, and the
    conversions or messages only when a test fails. ``check_finite``: also run
    :func:`check_score_range` (NaN/inf and the overflow bound), which reads every element.
    """
    dtype = getattr(x, "dtype", None)
    if not (type(x) is type(w_q) is type(w_k) is type(w_v) is np.ndarray
            and w_q.dtype is w_k.dtype is w_v.dtype is dtype and (dtype is _FLOAT64 or dtype is _FLOAT32)):
        x, w_q, w_k, w_v, dtype = _in_common_dtype_converted(x, w_q, w_k, w_v)  # anything but 4 arrays of one dtype
    x_shape, q_shape, k_shape, v_shape = x.shape, w_q.shape, w_k.shape, w_v.shape
    if not (len(x_shape) in x_ndims and len(q_shape) == len(k_shape) == len(v_shape) == 2
            and x_shape[-1] == q_shape[0] == k_shape[0] == v_shape[0] and q_shape[1] == k_shape[1] > 0):
        _check_shapes(x, (w_q, w_k, w_v), x_ndims, "[D_model, D]")
        if q_shape[1] != k_shape[1]:
            raise ValueError(f"w_q and w_k must share D_k: w_q {q_shape}, w_k {k_shape}")
        raise ValueError(f"D_k must be at least 1: w_q {q_shape}")
    if check_finite:
        check_score_range(x, w_q, w_k, w_v, dtype)
    return x, w_q, w_k, w_v, dtype


def _in_common_dtype_converted(x, w_q, w_k, w_v):
    """``x`` and the weights as float arrays, the weights cast to ``dtype = np.result_type`` of all four, and dtype."""
    x, w_q, w_k, w_v = _as_array("x", x), _as_array("w_q", w_q), _as_array("w_k", w_k), _as_array("w_v", w_v)
    dtype = np.result_type(x, w_q, w_k, w_v)
    return x, w_q.astype(dtype, copy=False), w_k.astype(dtype, copy=False), w_v.astype(dtype, copy=False), dtype


# Checks of q, k, v, the key mask and the window


def check_window(window, n_sink):
    """Return ``(window, n_sink)`` as ints: ``window`` None or >= 1, ``n_sink`` >= 0."""
    if window is not None:
        window = as_size("window", window, minimum=1)
    return window, as_size("n_sink", n_sink)


def check_scores_fit(dtype, q, *keys):
    """Raise ValueError if a score q·k, or any partial sum of it, could overflow ``dtype``.

    Cauchy–Schwarz bounds every partial sum by |q_t|·|k_s|, the largest norms over
    the last axis of ``q: [..., D_k]`` and of the ``keys`` arrays ``[..., D_k]``,
    scaled before squaring and compared as in ``_validation.check_score_range``.
    """
    log_k = max((_log10_max_norm(k) for k in keys), default=-math.inf)
    bounds = {"|q·k|": (_log10_max_norm(q) + log_k, "|q_t|·|k_s|")}
    raise_if_too_large("q and k are", bounds, dtype, "rescale q or k")


_NO_MASK = object()  # check_attention_inputs without valid= (attend's): None is a bad mask, not "no mask"


def check_attention_inputs(q, k, v, valid=_NO_MASK, check_finite=True):
    """Validate ``q: [..., T_q, D_k]``, ``k: [..., S, D_k]``, ``v: [..., S, D_v]`` (the same leading axes).

    Returns ``(q, k, v, dtype)``, each in ``dtype = np.result_type(q, k, v)``.
    ``valid``, when given (masked_attend's; None is refused), is a key-padding mask:
    a bool array ``[..., S]`` (k's shape without D_k). The checks of k and v then
    take only the keys and values it marks: NaN/inf is refused there only, and the
    overflow bounds take only those; a masked key or value holding NaN/inf is
    returned as 0 (in a copy), so that its weight 0 leaves the output exactly as
    for any finite content. ValueError also for D_k = 0, or a partial sum of q·k
    (|q_t|·|k_s|) or of the output (|v_s|) that could overflow. ``check_finite=False``
    skips every check that reads the elements (and the zeroing of masked keys).
    """
    q, k, v = _as_array("q", q), _as_array("k", k), _as_array("v", v)
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    if not (len(q_shape) >= 2 and len(k_shape) == len(v_shape) == len(q_shape)
            and q_shape[:-2] == k_shape[:-2] == v_shape[:-2] and k_shape[-1] == q_shape[-1] > 0
            and v_shape[-2] == k_shape[-2]):  # one test of every shape; the message only when it fails
        _raise_for_shapes(q_shape, k_shape, v_shape)
    if valid is not _NO_MASK:
        valid = as_key_mask(valid, k)
        if check_finite:
            k, v = _check_masked_range(q, k, v, valid)
    elif check_finite:
        _check_range(q, k, v)
    dtype = q.dtype
    if k.dtype is dtype and v.dtype is dtype:
        return q, k, v, dtype
    dtype = np.result_type(q, k, v)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False), dtype


def _raise_for_shapes(q_shape, k_shape, v_shape):
    """The ValueError of :func:`check_attention_inputs` for shapes that do not fit, naming them."""
    shapes = f"q {q_shape}, k {k_shape}, v {v_shape}"
    if (len(q_shape) < 2 or len(k_shape) != len(q_shape) or len(v_shape) != len(q_shape)
            or not q_shape[:-2] == k_shape[:-2] == v_shape[:-2]):
        raise ValueError(
            f"q, k and v must be [..., T_q, D_k], [..., S, D_k] and [..., S, D_v] "
            f"with the same leading axes, got {shapes}"
        )
    if k_shape[-1] != q_shape[-1] or v_shape[-2] != k_shape[-2]:
        raise ValueError(f"q and k must share D_k, and k and v the S axis: {shapes}")
    raise ValueError(f"D_k must be at least 1: {shapes}")


def _check_range(q, k, v):
    """Raise ValueError if q, k or v hold NaN/inf, or a partial sum of q·k or of the output could overflow.

    Fast path: one BLAS dot per array, its squared Frobenius norm, bounds |q_t|·|k_s|
    and |v_s| far inside either dtype (NaN/inf compare False); otherwise the exact
    check decides and names what failed.
    """
    q2, k2, v2 = sum_of_squares(q), sum_of_squares(k), sum_of_squares(v)
    if not (q2 * k2 <= _FAST_LIMIT_SQUARED and v2 <= _FAST_LIMIT_SQUARED and q2 <= _FAST_LIMIT_SQUARED):
        for name, a in (("q", q), ("k", k), ("v", v)):
            if not np.isfinite(a).all():
                raise NonFiniteError(f"{name} contains NaN or inf")
        dtype = np.result_type(q, k, v)
        check_scores_fit(dtype, q, k)
        raise_if_too_large("v is", {"|v|": (_log10_max_norm(v), "|v_s|")}, dtype, "rescale v")


def _check_masked_range(q, k, v, valid):
    """:func:`_check_range` over the keys and values ``valid`` marks; ``(k, v)``, masked NaN/inf as 0 (in a copy)."""
    if not np.isfinite(q).all():
        raise NonFiniteError("q contains NaN or inf")
    keys, values = k[valid], v[valid]  # [valid keys, D_k], [valid keys, D_v]
    k, v = finite_where_valid("k", k, keys, valid), finite_where_valid("v", v, values, valid)
    dtype = np.result_type(q, k, v)
    check_scores_fit(dtype, q, keys)
    raise_if_too_large("v is", {"|v|": (_log10_max_norm(values), "|v_s|")}, dtype, "rescale v")
    return k, v


def finite_where_valid(name, array, held, valid, where="at a valid key"):
    """``array: [..., S, D]`` itself if it is finite, else a copy with 0 at every key ``valid: [..., S]`` masks;
    ValueError naming ``name`` (and ``where``) if ``held``, ``array[valid]``, holds NaN/inf.

    0 · NaN is NaN, so a masked value holding NaN/inf would reach the output through
    its weight 0; 0 · a finite value is 0, so zeros leave the output as any finite content does.
    """
    if np.isfinite(array).all():  # the common case: one pass
        return array
    if not np.isfinite(held).all():
        raise NonFiniteError(f"{name} contains NaN or inf {where}")
    return np.where(valid[..., None], array, 0.0).astype(array.dtype, copy=False)


def as_key_mask(valid, k):
    """``valid`` as a bool array ``[..., S]`` of ``k: [..., S, D_k]``'s shape without D_k; TypeError or ValueError.

    TypeError also for None and for a masked array (whose mask np.asarray would drop).
    """
    expected = f"[..., S] = {list(k.shape[:-1])} for k {k.shape}"
    if valid is None or isinstance(valid, np.ma.MaskedArray):
        what = "None" if valid is None else "a masked array"
        raise TypeError(f"valid must be a bool array {expected}, got {what}")
    valid = np.asarray(valid)
    if valid.dtype != np.bool_:
        raise TypeError(f"valid must be a bool array, got dtype {valid.dtype}")
    if valid.shape != k.shape[:-1]:
        raise ValueError(f"valid must be {expected}, got shape {valid.shape}")
    return valid


# The computation


def softmax(scores):
    """Numerically stable softmax over the last axis.

    The row maximum is subtracted before ``exp``, so large finite scores stay
    finite; entries equal to ``-inf`` (masked) get weight 0. Each row must hold
    at least one finite score.
    """
    shifted = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


# A decode step over many keys (T_q <= 16 query rows, S > 2 blocks) is computed block by block: a block of
# 256 keys (128 KiB of K or V at D = 128 in float32) fits in L2, and one dot over it streams it there first.
# Measured on the 2-core EPYC of this repository (OpenBLAS SkylakeX, one thread), Llama-3-8B's step at
# S = 16,384: the scores' matmul read K 7x slower than K.sum() does, blocked 2x slower (the output's: 3x, 1.6x).
# Only where one head's K (or V) matrix outgrows L2 (1 MiB on that machine): a smaller one stays in cache
# from the previous step, and blocking it costs Python loops (the suite's heads decode at T = 1024, 128 KiB
# a head, was 2-4x slower blocked). And only for 2 or more query rows: one row's products are matrix-vector
# products, which stream K and V unblocked. Llama-2-7B's attention (1 row per K/V head) at S = 16,385, paired
# (15 alternations): unblocked 0.59x the blocked time on the SkylakeX kernel, 0.66x on Haswell. With G = 4
# rows (Llama-3-8B) the kernels disagree: unblocked 1.34x on SkylakeX, 0.75x on Haswell; blocked is kept.
_KEY_BLOCK = 256
_LONG_STEP_BYTES = 2**20


def _is_long_step(q, k):
    """True for 2 to 16 query rows against many keys: the step :func:`scaled_scores` and :func:`weighted_values` block."""
    return (1 < q.shape[-2] <= 16 and k.shape[-2] > 2 * _KEY_BLOCK
            and k.shape[-2] * k.shape[-1] * k.itemsize > _LONG_STEP_BYTES)


def scaled_scores(q, k):
    """q kᵀ / sqrt(D_k) of ``q: [..., T_q, D_k]`` and ``k: [..., S, D_k]``, S >= 1: ``[..., T_q, S]``."""
    if not _is_long_step(q, k):
        scores = q @ k.swapaxes(-1, -2)  # [..., T_q, S]
    else:
        scores_t = np.empty(k.shape[:-1] + q.shape[-2:-1], np.result_type(q, k))  # [..., S, T_q]
        for i in np.ndindex(q.shape[:-2]):
            q_t, k_i, scores_i = q[i].T, k[i], scores_t[i]  # [D_k, T_q], [S, D_k], [S, T_q]
            for start in range(0, k.shape[-2], _KEY_BLOCK):
                block = k_i[start : start + _KEY_BLOCK]  # [256, D_k]
                _vdot(block, block)  # streams the block into cache, which the matmul then reads fast
                np.matmul(block, q_t, out=scores_i[start : start + _KEY_BLOCK])  # [256, T_q]
        scores = np.ascontiguousarray(scores_t.swapaxes(-1, -2))  # [..., T_q, S], rows contiguous for the softmax
    scores *= 1.0 / math.sqrt(q.shape[-1])
    return scores


def weighted_values(weights, v):
    """``weights: [..., T_q, S]`` times ``v: [..., S, D_v]``: ``[..., T_q, D_v]``, a long step block by block."""
    if not _is_long_step(weights, v):
        return weights @ v  # [..., T_q, D_v]
    out = np.zeros(weights.shape[:-1] + v.shape[-1:], np.result_type(weights, v))  # [..., T_q, D_v]
    for i in np.ndindex(weights.shape[:-2]):
        weights_i, v_i, out_i = weights[i], v[i], out[i]  # [T_q, S], [S, D_v], [T_q, D_v]
        for start in range(0, v.shape[-2], _KEY_BLOCK):
            block = v_i[start : start + _KEY_BLOCK]  # [256, D_v]
            _vdot(block, block)  # streams the block into cache, as in scaled_scores
            out_i += weights_i[:, start : start + _KEY_BLOCK] @ block  # [T_q, D_v]
    return out


def attend(q, k, v, *, check_finite=True):
    """One attention step with no mask: softmax(q kᵀ / sqrt(D_k)) v, ``[..., T_q, D_v]``.

    ``q: [..., T_q, D_k]`` attends to every key of ``k: [..., S, D_k]``, ``v: [..., S,
    D_v]``: a decode step passes the keys written so far, which need no causal
    mask. q, k and v share their leading axes; D_k >= 1; S = 0 gives zeros.
    """
    check_finite = as_flag("check_finite", check_finite)
    q, k, v, dtype = check_attention_inputs(q, k, v, check_finite=False)  # the types, dtypes and shapes
    if check_finite and (k.shape[-2] == 0 or q.size == 0):
        _check_range(q, k, v)  # no score is computed to show a NaN/inf: scan the inputs
    if k.shape[-2] == 0:  # no key: zeros, the identity of attention states (split.attention_state)
        return np.zeros(q.shape[:-1] + v.shape[-1:], dtype)  # [..., T_q, D_v]
    if not check_finite:
        return weighted_values(softmax(scaled_scores(q, k)), v)  # [..., T_q, S] -> [..., T_q, D_v]
    with np.errstate(over="ignore", invalid="ignore"):
        scores = scaled_scores(q, k)  # [..., T_q, S]
        out = weighted_values(softmax(scores), v)  # [..., T_q, D_v]
    if not all_finite(scores, out):  # the inputs are read again only now, to name what failed
        _check_range(q, k, v)
        check_finite_output(out)
        raise NonFiniteError("a score overflowed: q and k are too large for the dtype; rescale q or k")
    return out


def masked_attend(q, k, v, valid, *, check_finite=True):
    """:func:`attend` over the keys that ``valid: [..., S]`` (bool, a key-padding mask) marks True.

    Every query of a row sees the same keys, as in a ragged batch where row n
    holds a sequence of ``valid[n].sum()`` positions. The mask is applied by
    selection (``np.where``) before the softmax, so a masked key gets weight
    exactly 0 whatever it holds, NaN and inf included (only the valid keys and
    values must be finite: a masked one holding NaN/inf is taken as 0, on a copy,
    which gives the output bit for bit as any finite content would), and a row with
    no valid key (S = 0 included) gives zeros, never NaN; with every key valid this
    is :func:`attend`. The overflow bounds take the valid keys only.
    """
    q, k, v, dtype = check_attention_inputs(q, k, v, valid, as_flag("check_finite", check_finite))
    if k.shape[-2] == 0:
        return np.zeros(q.shape[:-1] + v.shape[-1:], dtype)  # [..., T_q, D_v]
    valid = np.asarray(valid)
    if valid.all():
        return attend(q, k, v, check_finite=False)
    with np.errstate(over="ignore", invalid="ignore"):
        scores = scaled_scores(q, k)  # [..., T_q, S]
    scores = np.where(valid[..., None, :], scores, -np.inf)  # the mask, by selection: no arithmetic on masked scores
    row_max = scores.max(axis=-1, keepdims=True)  # [..., T_q, 1]; -inf for a row with nothing to attend to
    row_max[~valid.any(axis=-1)] = 0.0
    weights = np.exp(scores - row_max)  # masked keys: exp(-inf) = 0
    total = weights.sum(axis=-1, keepdims=True)
    weights /= np.where(total > 0, total, 1.0)
    return weights @ v  # [..., T_q, D_v]


def band_mask(q_positions, k_positions, window=None, n_sink=0):
    """``[T_q, S]`` bool, True where query position ``q_positions[i]`` may attend key position ``k_positions[j]``.

    s <= t, and t - s < window or s < n_sink (the module's mask convention);
    positions are int arrays ``[T_q]`` and ``[S]``, in any order.
    """
    t, s = q_positions[:, None], k_positions[None, :]  # [T_q, 1], [1, S]
    allowed = s <= t  # [T_q, S]
    if window is not None:
        allowed &= (t - s < window) | (s < n_sink)
    return allowed


def causal_attention(x, w_q, w_k, w_v, *, window=None, n_sink=0, check_finite=True):
    """Causal self-attention over the whole sequence at once: the reference.

    Position t attends to positions 0..t, or with ``window``/``n_sink`` to the
    banded subset of the module docstring. This is what prefill computes and what
    every decode strategy (and ``chunked_attention``, with the same window) must
    reproduce position by position. T = 0 gives an empty array.
    """
    window, n_sink = check_window(window, n_sink)
    check_finite = as_flag("check_finite", check_finite)
    x, w_q, w_k, w_v, dtype = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2, 3), check_finite=check_finite)
    t_len = x.shape[-2]
    if t_len == 0:
        return np.empty(x.shape[:-1] + w_v.shape[1:], dtype)  # [..., 0, D_v]
    positions = np.arange(t_len)
    blocked = ~band_mask(positions, positions, window, n_sink)  # [T, T], True where t may not attend s
    with np.errstate(over="ignore", invalid="ignore"):
        q = x @ w_q  # [..., T, D_k]
        k = x @ w_k  # [..., T, D_k]
        v = x @ w_v  # [..., T, D_v]
        scores = scaled_scores(q, k)  # [..., T, T]
        scores[..., blocked] = -np.inf
        out = softmax(scores) @ v  # [..., T, D_v]
    if check_finite:
        check_finite_output(out)
    return out
