"""Split-KV (flash-decoding) and cascade attention: partial attention states merged exactly by log-sum-exp.

The attention state of ``q: [..., T_q, D_k]`` over ``k: [..., S, D_k]``, ``v: [..., S, D_v]``
is ``out [..., T_q, D_v]`` (softmax(s) v, s = q kᵀ / sqrt(D_k)) and ``lse [..., T_q]``
(log Σ exp(s), natural log as FlashAttention's ``softmax_lse``; FlashInfer stores base 2).
The states of disjoint key sets A and B merge into that of A ∪ B:
    lse = log(exp(lse_A) + exp(lse_B)),  out = exp(lse_A - lse) · out_A + exp(lse_B - lse) · out_B
after subtracting the largest lse, so no exp overflows. The state of no keys (zeros,
-inf) is the identity; the shift is 0 where every lse is -inf, so no NaN is formed
(as FlashAttention's combine kernel, ``combine_attn_seqk_parallel``).

Bad input raises TypeError or ValueError naming it; ``check_finite`` (default True) scans
the inputs for NaN/inf, and an lse for NaN or +inf. Sources: Dao et al. 2023,
"Flash-Decoding for long-context inference"; FlashAttention's ``flash_attn_with_kvcache(...,
num_splits)``; FlashInfer's ``merge_state``/``merge_states`` and cascade inference
(``MultiLevelCascadeAttentionWrapper``).
"""

import functools

import numpy as np

from ._validation import as_array, as_flag, as_float_array, as_size, as_sizes_per_sequence, check_finite_array
from .attention import as_key_mask, attention_forward, check_attention_inputs


def as_num_splits(num_splits):
    """``num_splits`` as an int >= 1; TypeError for a non-integer (bools included), ValueError below 1."""
    return as_size("num_splits", num_splits, minimum=1)


def check_lse(name, array):
    """Raise ValueError unless every log-sum-exp of ``array`` is finite, or -inf for a state with no keys."""
    if np.isnan(array).any() or np.isposinf(array).any():
        raise ValueError(f"{name} contains NaN or +inf: an lse is finite, or -inf for a state with no keys "
                         "(FlashAttention before its PR #978 wrote +inf there; pass -inf)")


def check_attention_states(states, check_finite=True):
    """``states``, a non-empty sequence of ``(out [..., T_q, D_v], lse [..., T_q])`` of one shape, as ``(outs, lses,
    dtype)``: two lists in their ``np.result_type``."""
    if isinstance(states, (str, bytes, np.ndarray)) or not hasattr(states, "__iter__"):
        raise TypeError(f"states must be a sequence of (out, lse) pairs, got {type(states).__name__}")
    states = list(states)
    if not states:
        raise ValueError("states must hold at least one (out, lse) pair")
    outs, lses = [], []
    for i, state in enumerate(states):
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"states[{i}] must be an (out, lse) pair, got {type(state).__name__}")
        out, lse = as_array(f"states[{i}] out", state[0]), as_array(f"states[{i}] lse", state[1])
        if check_finite:
            check_finite_array(f"states[{i}] out", out)
            check_lse(f"states[{i}] lse", lse)
        if out.ndim < 2 or lse.shape != out.shape[:-1]:
            raise ValueError(f"states[{i}] must be out [..., T_q, D_v] and lse [..., T_q], got out {out.shape}, lse {lse.shape}")
        if outs and out.shape != outs[0].shape:
            raise ValueError(f"every state must have the shape of states[0]: out {outs[0].shape}, states[{i}] out {out.shape}")
        outs.append(out)
        lses.append(lse)
    dtype = np.result_type(*outs, *lses)
    return [o.astype(dtype, copy=False) for o in outs], [s.astype(dtype, copy=False) for s in lses], dtype


def _padded(arrays, s_max, width):
    """B arrays ``[S_i, width]`` as one ``[B, s_max, width]`` array, zero past each S_i."""
    padded = np.zeros((len(arrays), s_max, width), np.result_type(*arrays) if arrays else np.float64)
    for b, a in enumerate(arrays):
        padded[b, : len(a)] = a
    return padded


def _as_suffixes(k_suffix, v_suffix, suffix_lengths, d_k, d_v, check_finite):
    """The suffixes padded, ``[B, S_max, D_k]`` and ``[B, S_max, D_v]``, and their lengths ``[B]`` (None: all S_max).
    A padding may hold anything; returned as 0 (in a copy) where it holds NaN/inf."""
    read = functools.partial(as_float_array if check_finite else as_array, storage=True)
    if isinstance(k_suffix, (list, tuple)) and isinstance(v_suffix, (list, tuple)):
        if suffix_lengths is not None:
            raise ValueError("suffix_lengths is for padded suffixes [B, S_max, D]; lists of suffixes carry their own")
        ks = [read(f"k_suffix[{i}]", k) for i, k in enumerate(k_suffix)]
        vs = [read(f"v_suffix[{i}]", v) for i, v in enumerate(v_suffix)]
        if len(ks) != len(vs):
            raise ValueError(f"k_suffix has {len(ks)} suffixes but v_suffix has {len(vs)}")
        for i, (k, v) in enumerate(zip(ks, vs)):
            if k.ndim != 2 or v.ndim != 2 or len(k) != len(v) or k.shape[1] != d_k or v.shape[1] != d_v:
                raise ValueError(f"k_suffix[{i}] and v_suffix[{i}] must be [S_i, D_k={d_k}] and [S_i, D_v={d_v}], "
                                 f"got {k.shape} and {v.shape}")
        lengths = np.array([len(k) for k in ks], dtype=np.int64)
        s_max = int(lengths.max(initial=0))
        full = bool((lengths == s_max).all())
        return _padded(ks, s_max, d_k), _padded(vs, s_max, d_v), None if full else lengths
    if not isinstance(k_suffix, np.ndarray) or not isinstance(v_suffix, np.ndarray):
        raise TypeError("k_suffix and v_suffix must both be lists of B arrays [S_i, D] or both arrays [B, S_max, D], "
                        f"got {type(k_suffix).__name__} and {type(v_suffix).__name__}")
    if suffix_lengths is not None:
        read = functools.partial(as_array, storage=True)  # with lengths, the padding is not checked
    k_suffix, v_suffix = read("k_suffix", k_suffix), read("v_suffix", v_suffix)
    if (k_suffix.ndim != 3 or v_suffix.ndim != 3 or k_suffix.shape[:2] != v_suffix.shape[:2]
            or k_suffix.shape[2] != d_k or v_suffix.shape[2] != d_v):
        raise ValueError(f"k_suffix and v_suffix must be [B, S_max, D_k={d_k}] and [B, S_max, D_v={d_v}] (or lists of "
                         f"B arrays [S_i, D]), got k_suffix {k_suffix.shape}, v_suffix {v_suffix.shape}")
    if suffix_lengths is None:
        return k_suffix, v_suffix, None
    lengths = as_sizes_per_sequence("suffix_lengths", suffix_lengths, k_suffix.shape[0])
    if lengths.size and lengths.max() > k_suffix.shape[1]:
        raise ValueError(f"suffix_lengths must be at most S_max={k_suffix.shape[1]}, got {lengths.tolist()}")
    held = _held_suffix_keys(k_suffix, lengths)  # [B, S_max]
    for name, a in (("k_suffix", k_suffix), ("v_suffix", v_suffix)):
        if check_finite and not np.isfinite(a[held]).all():
            raise ValueError(f"{name} contains NaN or inf within suffix_lengths")
    if not np.isfinite(v_suffix).all():  # padding: 0·NaN would be NaN
        v_suffix = np.where(held[..., None], v_suffix, 0.0).astype(v_suffix.dtype, copy=False)
    return k_suffix, v_suffix, lengths


def _held_suffix_keys(k_suffix, lengths):
    """``[B, S_max]`` bool: True at the keys of ``k_suffix: [B, S_max, D_k]`` within ``lengths`` (None: all)."""
    return np.arange(k_suffix.shape[1]) < (k_suffix.shape[1] if lengths is None else lengths[:, None])


def check_cascade_inputs(q, k_shared, v_shared, k_suffix, v_suffix, suffix_lengths, check_finite=True):
    """Cascade attention's inputs as ``(q, k_shared, v_shared, k_suffix, v_suffix, lengths, dtype)``, in their
    ``np.result_type``, the suffixes padded (:func:`_as_suffixes`)."""
    read = functools.partial(as_float_array if check_finite else as_array, storage=True)  # K/V: bfloat16, float16 too
    q = (as_float_array if check_finite else as_array)("q", q)
    k_shared, v_shared = read("k_shared", k_shared), read("v_shared", v_shared)
    if q.ndim != 3 or q.shape[-1] == 0:
        raise ValueError(f"q must be [B, T_q, D_k] with D_k >= 1, got shape {q.shape}")
    if k_shared.ndim != 2 or v_shared.ndim != 2 or len(k_shared) != len(v_shared) or k_shared.shape[1] != q.shape[2]:
        raise ValueError(f"k_shared and v_shared must be [S_p, D_k={q.shape[2]}] and [S_p, D_v], "
                         f"got k_shared {k_shared.shape}, v_shared {v_shared.shape}")
    k_suffix, v_suffix, lengths = _as_suffixes(k_suffix, v_suffix, suffix_lengths, q.shape[2], v_shared.shape[1],
                                               check_finite)
    if len(k_suffix) != len(q):
        raise ValueError(f"q has B={len(q)} sequences but there are {len(k_suffix)} suffixes: q {q.shape}")
    arrays = (q, k_shared, v_shared, k_suffix, v_suffix)
    dtype = np.result_type(*arrays)
    return (*(a.astype(dtype, copy=False) for a in arrays), lengths, dtype)


def _merge(outs, lses):
    """The merge of N states ``out [..., T_q, D_v]``, ``lse [..., T_q]``, inputs already checked."""
    lse = np.stack(lses)  # [N, ..., T_q]
    top = lse.max(axis=0)  # [..., T_q]
    shift = np.where(np.isneginf(top), 0.0, top)  # rows of identities only: exp(-inf - 0) = 0, never NaN
    weights = np.exp(lse - shift)  # [N, ..., T_q]: 0 for an identity, 1 for the largest lse
    total = weights.sum(axis=0)  # [..., T_q], 0 only where every state is an identity
    with np.errstate(divide="ignore"):
        merged_lse = shift + np.log(total)  # -inf where total is 0
    weights /= np.where(total > 0, total, 1.0)  # each state's share of the merged softmax, summing to 1
    out = (weights[..., None] * np.stack(outs)).sum(axis=0)  # [N, ..., T_q, D_v] -> [..., T_q, D_v]
    return out, merged_lse


def _split_bounds(s_len, num_splits):
    """Part i of S keys is ``bounds[i]:bounds[i+1]``, ``i * S // num_splits``: sizes differ by at most one."""
    return [i * s_len // num_splits for i in range(num_splits + 1)]


def attention_state(q, k, v, *, valid=None, check_finite=True):
    """The attention state ``(out [..., T_q, D_v], lse [..., T_q])`` of ``q: [..., T_q, D_k]`` over ``k: [..., S,
    D_k]``, ``v: [..., S, D_v]``. ``valid: [..., S]`` (bool) masks keys as
    :func:`~kv_attention.attention.masked_attend`; no key (S = 0, or none valid) gives the identity, zeros and -inf.
    """
    check_finite = as_flag("check_finite", check_finite)
    q, k, v, dtype = check_attention_inputs(q, k, v, check_finite and valid is None)
    if valid is not None:
        valid = as_key_mask(valid, k)
        if check_finite:
            for name, a in (("q", q), ("k", k[valid]), ("v", v[valid])):
                check_finite_array(name, a)
    return _state(q, k, v, valid)


def _state(q, k, v, valid=None):
    """:func:`attention_state` of checked inputs: attention_forward with its lse."""
    return attention_forward(q, k, v, None if valid is None else valid[..., None, :], return_lse=True)


def merge_attention_states(states, *, check_finite=True):
    """Merge attention states ``(out [..., T_q, D_v], lse [..., T_q])`` over disjoint key sets into the state over
    their union, of the same shapes; an lse of -inf (no keys) gets no weight."""
    outs, lses, _ = check_attention_states(states, as_flag("check_finite", check_finite))
    return _merge(outs, lses)


def split_kv_attention(q, k, v, *, num_splits, return_lse=False, check_finite=True):
    """``attend(q, k, v)`` up to rounding, as flash-decoding computes it: S split into ``num_splits`` parts
    (:func:`_split_bounds`), their states merged. ``return_lse=True`` also returns the lse ``[..., T_q]``."""
    num_splits, return_lse = as_num_splits(num_splits), as_flag("return_lse", return_lse)
    q, k, v, _ = check_attention_inputs(q, k, v, as_flag("check_finite", check_finite))
    bounds = _split_bounds(k.shape[-2], num_splits)
    parts = [_state(q, k[..., a:b, :], v[..., a:b, :]) for a, b in zip(bounds, bounds[1:])]
    out, lse = _merge(*zip(*parts))  # each part [..., T_q, D_v] and [..., T_q]
    return (out, lse) if return_lse else out


def cascade_attention(q, k_shared, v_shared, k_suffix, v_suffix, *, suffix_lengths=None, return_lse=False,
                      check_finite=True):
    """Attention of B sequences over one shared prefix, read once by all B·T_q query rows in one product, and their
    own suffixes, merged (FlashInfer's two-level cascade).

    ``q: [B, T_q, D_k]``; ``k_shared: [S_p, D_k]``, ``v_shared: [S_p, D_v]``; the suffixes as lists of B arrays
    ``[S_i, D]``, or arrays ``[B, S_max, D]`` with ``suffix_lengths`` (keys past a length get weight exactly 0).
    Returns ``[B, T_q, D_v]`` (and the lse ``[B, T_q]`` with ``return_lse=True``).
    """
    return_lse, check_finite = as_flag("return_lse", return_lse), as_flag("check_finite", check_finite)
    q, k_shared, v_shared, k_suffix, v_suffix, lengths, _ = check_cascade_inputs(
        q, k_shared, v_shared, k_suffix, v_suffix, suffix_lengths, check_finite
    )
    batch, t_q, d_k = q.shape
    shared_out, shared_lse = _state(q.reshape(batch * t_q, d_k), k_shared, v_shared)  # [B·T_q, D_v], [B·T_q]
    valid = None if lengths is None else _held_suffix_keys(k_suffix, lengths)  # [B, S_max]
    suffix_out, suffix_lse = _state(q, k_suffix, v_suffix, valid)
    out, lse = _merge((shared_out.reshape(batch, t_q, v_shared.shape[1]), suffix_out), (shared_lse.reshape(batch, t_q), suffix_lse))
    return (out, lse) if return_lse else out
