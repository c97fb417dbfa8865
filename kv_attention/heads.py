"""Multi-head, grouped-query and multi-query causal attention: the reference and the decode.

Axis letters used in names and shape comments:
    B     batch (independent sequences)      T      sequence length (positions)
    S     key positions attended to          H_q    query heads (``n_heads``)
    H_kv  K/V heads (``n_kv_heads``)         G      group size, ``n_heads // n_kv_heads``
    D_model  model width                     D_head per-head width (``head_dim``)
    D_out    output width of ``w_o`` (D_model in a transformer layer)
Leading ``...`` axes are batch-like and never mixed.

Inputs: ``x: [T, D_model]`` or ``[B, T, D_model]``, ``w_q: [D_model, H_q·D_head]``,
``w_k, w_v: [D_model, H_kv·D_head]``, ``w_o: [H_q·D_head, D_out]``, float32 or
float64, and integer counts H_q, H_kv >= 1 with H_kv dividing H_q. The output
``[..., T, D_out]`` is in ``np.result_type`` of the inputs; scale 1/sqrt(D_head).
Bad input raises TypeError for an input that is not a float32/float64 array or a
count that is not an integer, and ValueError for a bad count or shapes that do not
fit (named in the message), before anything is computed; and ValueError for
NaN/inf or overflow, found as ``check_finite`` (keyword, default True) says.
``multi_head_decode`` checks what it computes, as ``attend`` does: every score of
every step and the output must be finite, which any NaN/inf in x, a weight or a
given cache's K/V makes them fail (NaN propagates, and 0·inf is NaN), as any
overflow does. A decode at model shapes thus reads its weights and its cache once
per step, not once more for a scan. Only when a check fails are the inputs scanned,
after a given cache was rolled back, to name the cause: NaN/inf in x, a weight, or
the cache's stored keys or values, then the overflow bound of
``_validation.check_score_range``. Any other error (a user cache's own, a shape
it returns) comes through as raised; every error of these checks is a
``_validation.NonFiniteError``, a ValueError. Whether a sum whose partial sums
overflow but whose total does not is refused depends on the order BLAS adds in;
what is returned is right either way. A call that computes no score (T = 0, B = 0)
scans its inputs first, and so does ``multi_head_attention``; a split decode
(``num_splits``) checks each step's q, k and v as ``split_kv_attention`` does
(NaN/inf and the bound), then names the cause as above. With False every element
check is skipped, a given StaticCache's or DynamicCache's ``update`` included.

MHA (H_kv = H_q) is Vaswani et al. 2017, section 3.2.2; MQA (H_kv = 1) is Shazeer
2019, "Fast Transformer Decoding: One Write-Head is All You Need"; GQA (1 < H_kv
< H_q) is Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer
Models". Query head h reads K/V head ``h // G``, so consecutive query heads share
a K/V head: the order of the Llama reference code's ``repeat_kv`` (``expand`` then
``reshape``, i.e. repeat-interleave) and of FlashAttention's GQA; ``h % H_kv``
would be a different, wrong model.
"""

import functools

import numpy as np

from ._validation import (
    NonFiniteError,
    _as_array,
    all_finite,
    as_flag,
    as_size,
    check_choice,
    check_finite_array,
    check_finite_output,
    check_score_range,
    overflowed,
)
from .attention import _WEIGHT_NAMES, _check_shapes, attend, causal_attention
from .cache import DynamicCache, StaticCache, as_cache, check_head_cache_fits, rolled_back_on_error
from .quantized import QuantizedCache
from .split import as_num_splits, split_kv_attention

PATHS = ("repeat_kv", "grouped")
_LIBRARY_UPDATES = (StaticCache.update, DynamicCache.update, QuantizedCache.update)  # each takes check_finite


# Checks of the head counts, x and the four weights, and a given cache


def check_head_counts(n_heads, n_kv_heads):
    """Return ``(n_heads, n_kv_heads)`` as ints >= 1, with n_heads a multiple of n_kv_heads."""
    n_heads = as_size("n_heads", n_heads, minimum=1)
    n_kv_heads = as_size("n_kv_heads", n_kv_heads, minimum=1)
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}: "
            "every K/V head must serve the same number of query heads"
        )
    return n_heads, n_kv_heads


def _head_dim(w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """D_head = ``w_q.shape[1] // n_heads``; ValueError unless every weight's width is heads × D_head."""
    head_dim, rest = divmod(w_q.shape[1], n_heads)
    if rest or head_dim == 0:
        raise ValueError(
            f"w_q has {w_q.shape[1]} columns, which is not n_heads={n_heads} × head_dim "
            f"for any head_dim >= 1: w_q {w_q.shape}"
        )
    for name, w in (("w_k", w_k), ("w_v", w_v)):
        if w.shape[1] != n_kv_heads * head_dim:
            raise ValueError(
                f"{name} has {w.shape[1]} columns but n_kv_heads × head_dim = {n_kv_heads} × {head_dim} "
                f"= {n_kv_heads * head_dim} (head_dim from w_q {w_q.shape}, n_heads={n_heads}): "
                f"{name} {w.shape}"
            )
    if w_o.shape[0] != n_heads * head_dim:
        raise ValueError(
            f"w_o has {w_o.shape[0]} rows but n_heads × head_dim = {n_heads} × {head_dim} "
            f"= {n_heads * head_dim}: w_o {w_o.shape}"
        )
    return head_dim


def check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """Validate the types, dtypes and shapes of ``x`` and the four weights (counts already checked); reads no element.

    Returns ``(x, w_q, w_k, w_v, w_o, head_dim, dtype)``, the weights in ``dtype = np.result_type`` of all five.
    """
    x = _as_array("x", x)
    weights = [_as_array(name, w) for name, w in zip(_WEIGHT_NAMES, (w_q, w_k, w_v, w_o))]
    _check_shapes(x, weights, (2, 3), "a matrix [rows, columns]")
    head_dim = _head_dim(*weights, n_heads, n_kv_heads)
    dtype = np.result_type(x, *weights)
    w_q, w_k, w_v, w_o = (w.astype(dtype, copy=False) for w in weights)
    return x, w_q, w_k, w_v, w_o, head_dim, dtype


def check_head_range(x, w_q, w_k, w_v, w_o, dtype, stored_k=None):
    """The scan of ``check_finite``: NaN/inf in x or a weight, and the overflow bound (``stored_k``: a cache's keys).

    |q_h| <= |x|·|w_q|_F for every head h, so one bound covers every head; w_o enters no bound.
    """
    check_score_range(x, w_q, w_k, w_v, dtype, stored_k)
    check_finite_array("w_o", w_o)


# The reference and the decode


def multi_head_attention(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, check_finite=True):
    """Causal multi-head attention over the whole sequence at once: the reference.

    Query head h is :func:`causal_attention` with its columns of ``w_q`` and K/V
    head ``h // G``'s of ``w_k`` and ``w_v``; the heads are concatenated in order and
    projected by ``w_o``. One head and ``w_o`` the identity give :func:`causal_attention`.
    """
    check_finite = as_flag("check_finite", check_finite)
    n_heads, n_kv_heads = check_head_counts(n_heads, n_kv_heads)
    x, w_q, w_k, w_v, w_o, head_dim, dtype = check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads)
    if check_finite:
        check_head_range(x, w_q, w_k, w_v, w_o, dtype)
    group = n_heads // n_kv_heads
    heads = []
    with np.errstate(over="ignore", invalid="ignore"):
        for h in range(n_heads):
            q_cols = slice(h * head_dim, (h + 1) * head_dim)
            kv_cols = slice((h // group) * head_dim, (h // group + 1) * head_dim)  # K/V head h // G
            head = causal_attention(x, w_q[:, q_cols], w_k[:, kv_cols], w_v[:, kv_cols], check_finite=False)
            heads.append(head)  # [..., T, D_head]
        out = np.concatenate(heads, axis=-1) @ w_o  # [..., T, H_q·D_head] -> [..., T, D_out]
    if check_finite:
        check_finite_output(out)
    return out


def _unchecked_attend(q, k, v):
    """:func:`~kv_attention.attention.attend` on the decode's own projections and cache views, unchecked."""
    return attend(q, k, v, check_finite=False)


class _DecodeCheckFailed(NonFiniteError):
    """A check of the decode's own failed (a step's attention, or the output): the decode then names the cause.

    Its own class, so that a NonFiniteError a user's cache raises comes through as raised.
    """


class _OutputNotFinite(_DecodeCheckFailed):
    """Every step's attention was finite but the output projection was not: the cause is w_o, or heads @ w_o."""


def _checked(attention=None):
    """``attention(q, k, v)`` with ``check_finite=True``, its NonFiniteError raised as :class:`_DecodeCheckFailed`.

    ``attention``: split-KV attention, or None for :func:`~kv_attention.attention.attend` (looked up at each
    call), whose checks test what it computed: every score and the output finite.
    """

    def checked(q, k, v):
        try:
            return (attention or attend)(q, k, v, check_finite=True)
        except NonFiniteError as error:
            raise _DecodeCheckFailed(str(error)) from None

    return checked


_checked_attend = _checked()


def _attend_repeat_kv(q, k, v, attention=None):
    """One decode step by repeating each K/V head G times, as Llama's ``repeat_kv`` does.

    ``q: [..., H_kv, G, D_head]`` is the new position's queries by group, ``k, v:
    [..., H_kv, S, D_head]`` the cache's views. For G > 1 each step materialises
    ``[..., H_q, S, D_head]`` copies of K and V; for G = 1 (MHA) it uses the views,
    as ``repeat_kv`` does for ``n_rep == 1``. ``attention``: ``attend`` when None, or split-KV attention.
    """
    *lead, n_kv_heads, group, head_dim = q.shape
    if group > 1:
        k = np.repeat(k, group, axis=-3)  # [..., H_q, S, D_head], K/V head j -> query heads jG..jG+G-1
        v = np.repeat(v, group, axis=-3)  # [..., H_q, S, D_head]
    q = q.reshape((*lead, n_kv_heads * group, 1, head_dim))  # [..., H_q, 1, D_head]
    return (attention or _unchecked_attend)(q, k, v)  # [..., H_q, 1, D_head]


def _attend_grouped(q, k, v, attention=None):
    """One decode step on the cache's own views: the G query heads of a group are G query rows.

    Shapes as :func:`_attend_repeat_kv`. One ``[G, D_head] x [D_head, S]`` product
    per K/V head instead of G against G copies. FlashAttention-2 does the same for
    one query position (``seqlenq_ngroups_swapped`` in ``flash_api.cpp``: q
    ``(b, 1, H_kv·G, d)`` viewed as ``(b, G, H_kv, d)``).
    """
    return (attention or _unchecked_attend)(q, k, v)  # scores [..., H_kv, G, S] -> [..., H_kv, G, D_head]


_STEPS = {"repeat_kv": _attend_repeat_kv, "grouped": _attend_grouped}


def _decode_heads(x, w_q, w_k, w_v, w_o, n_kv_heads, head_dim, step, cache, update, check_finite):
    """The decode loop over validated ``x: [..., T, D_model]`` through ``cache``, writing with ``update``.

    ``update`` is a caller's ``cache.update``, or the decode's own cache's with ``check_finite=False``.
    """
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
            k, v = update(k_t, v_t)  # views [..., H_kv, t+1, D_head]
            q_t = (x_t @ w_q).reshape(q_shape)  # [..., H_kv, G, D_head]
            heads = step(q_t, k, v)  # [..., H_kv, G, D_head] or [..., H_q, 1, D_head]
            out[..., t, :] = heads.reshape(heads_shape) @ w_o  # [..., D_out]
        if check_finite and not all_finite(out):
            raise _OutputNotFinite("the output is not finite")
    return out


def _split_kv_step(path, num_splits, check_finite):
    """The step of ``path`` with each head's attention split over the cache: S into ``num_splits`` parts, merged.

    ``check_finite``: split-KV attention's own checks of its q, k and v at every step (NaN/inf and the bound).
    """
    attention = functools.partial(split_kv_attention, num_splits=num_splits)
    if check_finite:
        return functools.partial(_STEPS[path], attention=_checked(attention))
    return functools.partial(_STEPS[path], attention=functools.partial(attention, check_finite=False))


def multi_head_decode(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, path="grouped", cache=None, num_splits=None,
                      check_finite=True):
    """Decode token by token through a ``[B, H_kv, T_max, D_head]`` K/V cache.

    At step t only ``x[..., t, :]`` is projected: its H_kv keys and values go into
    the cache and its H_q queries attend over the first t+1 positions. Equals
    :func:`multi_head_attention` position by position. Two paths, the same result
    up to rounding (about 1e-16 in float64):
        ``"repeat_kv"``: repeat each K/V head G times per step (the common approach:
        Llama's ``repeat_kv``, gpt-fast), one query row per head.
        ``"grouped"`` (default): a group's G query heads as G query rows against
        their K/V head's cache view; K/V are never copied.

    ``cache``: a Cache of ``[*x.shape[:-2], H_kv, T_max, D_head]`` with room for T
    more positions, e.g. ``StaticCache((B, n_kv_heads), T_max, head_dim, head_dim)``;
    positions in it are attended to (a prefill). Default: a new StaticCache of
    exactly T positions.
    ``num_splits`` (default None: not split): at every step each head attends over
    the cache's t+1 positions as flash-decoding does, in ``num_splits`` contiguous
    parts merged by log-sum-exp (:func:`~kv_attention.split.split_kv_attention`;
    FlashAttention's ``flash_attn_with_kvcache(num_splits=...)``). Equal up to
    rounding for every ``num_splits >= 1``, bit for bit at 1.
    Also raises ValueError for an unknown path or a cache that does not fit or is
    too short, TypeError for a non-cache or one of another dtype, and TypeError or
    ValueError for a num_splits that is not an integer >= 1; a failed call leaves a
    given cache unchanged.
    """
    check_choice("path", path, PATHS)
    check_finite = as_flag("check_finite", check_finite)
    if num_splits is not None:
        step = _split_kv_step(path, as_num_splits(num_splits), check_finite)
    elif check_finite:  # attend checks what it computes: every score and its output finite
        step = functools.partial(_STEPS[path], attention=_checked_attend)
    else:
        step = _STEPS[path]
    n_heads, n_kv_heads = check_head_counts(n_heads, n_kv_heads)
    x, w_q, w_k, w_v, w_o, head_dim, dtype = check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads)
    stored_k = None
    if cache is not None:
        cache = as_cache(cache)
        stored_k = check_head_cache_fits(cache, x, n_kv_heads, head_dim, dtype)
    if check_finite and x.size == 0:  # no step computes a score to show a NaN/inf: scan the inputs
        _scan_inputs(x, w_q, w_k, w_v, w_o, dtype, stored_k, cache)
    if cache is None:
        cache = StaticCache(x.shape[:-2] + (n_kv_heads,), x.shape[-2], head_dim, head_dim, dtype)
        update = functools.partial(cache.update, check_finite=False)  # the decode's own: its values checked in attend
    elif type(cache).update in _LIBRARY_UPDATES:  # the new K/V are checked through the scores (or not at all)
        update = functools.partial(cache.update, check_finite=False)
    else:
        update = cache.update
    try:
        return _decode_heads(x, w_q, w_k, w_v, w_o, n_kv_heads, head_dim, step, cache, update, check_finite)
    except _DecodeCheckFailed as error:  # a check of the decode's own failed, after the cache was rolled back
        _raise_the_cause(x, w_q, w_k, w_v, w_o, dtype, stored_k, cache, isinstance(error, _OutputNotFinite))


def _raise_the_cause(x, w_q, w_k, w_v, w_o, dtype, stored_k, cache, in_the_output):
    """After a check failed: the ValueError naming its cause (:func:`_scan_inputs`), else the output check's.

    ``in_the_output``: every step's attention was finite, so only w_o or ``heads @ w_o`` can be the cause,
    and the bound of the scores is not asked.
    """
    try:
        if in_the_output:
            check_finite_array("w_o", w_o)
        else:
            _scan_inputs(x, w_q, w_k, w_v, w_o, dtype, stored_k, cache)
    except NonFiniteError as named:
        raise named from None
    raise overflowed(dtype) from None


def _scan_inputs(x, w_q, w_k, w_v, w_o, dtype, stored_k, cache):
    """NaN/inf in x, a weight, or the cache's stored keys or values, then the overflow bound of the scores."""
    arrays = {"x": x, "w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o}
    if stored_k is not None:
        arrays["k_cache (its stored keys)"] = stored_k
        arrays["v_cache (its stored values)"] = cache.v_cache[..., : stored_k.shape[-2], :]
    for name, array in arrays.items():
        check_finite_array(name, array)
    check_score_range(x, w_q, w_k, w_v, dtype, stored_k)
