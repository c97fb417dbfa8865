"""Split-KV (flash-decoding) and cascade attention: partial attention states merged exactly by log-sum-exp.

Axis letters as in ``attention``: B batch, T_q query rows, S keys (S_p a shared
prefix, S_i the suffix of sequence i), D_k and D_v feature widths. Leading ``...``
axes are batch-like and never mixed.

The attention state of ``q: [..., T_q, D_k]`` over ``k: [..., S, D_k]`` and
``v: [..., S, D_v]`` is the pair, for the scaled scores s = q kᵀ / sqrt(D_k):
    out  [..., T_q, D_v]   softmax(s) v, exactly as ``attention.attend`` gives it
    lse  [..., T_q]        log Σ_j exp(s_j), the natural log-sum-exp
The lse is in natural log, as FlashAttention's ``softmax_lse`` and ``torch.logsumexp``;
FlashInfer's kernels store it in base 2 (``m + log2(d)`` in ``state_t``): divide ours by
ln 2 to compare. The states of two disjoint key sets A and B merge into that of A ∪ B:
    lse = log(exp(lse_A) + exp(lse_B))
    out = exp(lse_A - lse) · out_A + exp(lse_B - lse) · out_B
computed after subtracting the largest lse, so no exp overflows whatever the scores.
The merge is exact up to rounding, commutative and associative. The state with no
keys, ``out`` zeros and ``lse`` -inf, is its identity: merged with a state it returns
that state bit for bit, and merging only identities returns the identity, never NaN
(the shift is 0 where every lse is -inf, so no -inf - (-inf) is formed).

Inputs are float32 or float64 arrays and a computation runs in their
``np.result_type``. Bad input raises before anything is computed: TypeError for
an input that is not a float32/float64 array, a state that is not an ``(out, lse)``
pair, a ``num_splits`` that is not an integer, or a ``return_lse`` other than
True/False; ValueError for shapes that do not fit (named in the message), NaN/inf
in an input, an lse of NaN or +inf, ``num_splits`` below 1, or scores that could
overflow the dtype.

Sources: Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context inference"
(Stanford CRFM blog); FlashAttention's ``flash_attn_with_kvcache(..., num_splits)`` and
its combine kernel (``combine_attn_seqk_parallel`` in ``csrc/flash_attn/src/flash_fwd_kernel.h``,
which also takes the shift 0 for an all -inf row); FlashInfer's ``merge_state`` and
``merge_states`` (``flashinfer.cascade``), its "attention states and recursive attention"
tutorial, and cascade inference (``MultiLevelCascadeAttentionWrapper``; the FlashInfer
blog "Cascade Inference: Memory Bandwidth Efficient Shared Prefix Batch Decoding", 2024).
"""

import math

import numpy as np

from ._validation import (
    as_flag,
    as_num_splits,
    check_attention_inputs,
    check_attention_states,
    check_cascade_inputs,
    check_finite_output,
)


def _attention_state(q, k, v, valid=None):
    """Unchecked core of :func:`attention_state`; ``valid``, broadcast to ``[..., T_q, S]``, masks keys out.

    A row with no key to attend to (S = 0, or nothing valid) gets the identity: zeros and -inf.
    """
    dtype = np.result_type(q, k, v)
    if k.shape[-2] == 0:
        return np.zeros(q.shape[:-1] + v.shape[-1:], dtype), np.full(q.shape[:-1], -np.inf, dtype)
    scores = q @ k.swapaxes(-1, -2)  # [..., T_q, S]
    scores *= 1.0 / math.sqrt(q.shape[-1])
    if valid is not None:
        scores = np.where(valid, scores, -np.inf)  # by selection: a masked key gets weight exactly 0
    top = scores.max(axis=-1, keepdims=True)  # [..., T_q, 1]
    if valid is not None:
        top[np.isneginf(top)] = 0.0  # a row with nothing valid: exp(-inf - 0) = 0, total 0, lse -inf
    weights = np.exp(scores - top)  # [..., T_q, S], the largest 1
    total = weights.sum(axis=-1, keepdims=True)  # [..., T_q, 1], in [1, S] (0 for a fully masked row)
    with np.errstate(divide="ignore"):
        lse = (top + np.log(total))[..., 0]  # [..., T_q]
    weights /= total if valid is None else np.where(total > 0, total, 1.0)
    return weights @ v, lse  # [..., T_q, D_v], [..., T_q]


def _merge(outs, lses):
    """Unchecked core of :func:`merge_attention_states`: N states ``out [..., T_q, D_v]``, ``lse [..., T_q]``."""
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
    """Start of each of the ``num_splits`` contiguous parts of S keys, and S: part i is ``bounds[i]:bounds[i+1]``.

    ``i * S // num_splits``: sizes differ by at most one, and the empty parts of
    ``num_splits > S`` fall between non-empty ones.
    """
    return [i * s_len // num_splits for i in range(num_splits + 1)]


def _split_kv_attention(q, k, v, num_splits):
    """Unchecked core of :func:`split_kv_attention`: ``(out, lse)``."""
    bounds = _split_bounds(k.shape[-2], num_splits)
    parts = [_attention_state(q, k[..., a:b, :], v[..., a:b, :]) for a, b in zip(bounds, bounds[1:])]
    outs, lses = zip(*parts)  # each part [..., T_q, D_v] and [..., T_q]
    return _merge(outs, lses)


def attention_state(q, k, v):
    """The attention state ``(out, lse)`` of ``q: [..., T_q, D_k]`` over ``k: [..., S, D_k]``, ``v: [..., S, D_v]``.

    ``out: [..., T_q, D_v]`` is ``attend(q, k, v)`` bit for bit and ``lse: [..., T_q]``
    the natural log-sum-exp of the scaled scores. S = 0 gives the identity of the
    merge: ``out`` zeros and ``lse`` -inf, never NaN.
    """
    q, k, v, _ = check_attention_inputs(q, k, v)
    with np.errstate(over="ignore", invalid="ignore"):
        out, lse = _attention_state(q, k, v)
    check_finite_output(out)
    return out, lse


def merge_attention_states(states):
    """Merge a sequence of attention states ``(out, lse)`` over disjoint key sets into the state over their union.

    Every ``out`` is ``[..., T_q, D_v]`` and every ``lse`` ``[..., T_q]``, finite or
    -inf (a state with no keys: no weight, its ``out`` is not used). Returns ``(out,
    lse)`` of the same shapes. A state whose lse is -inf changes nothing; only such
    states give zeros and -inf.
    """
    outs, lses, _ = check_attention_states(states)
    with np.errstate(over="ignore", invalid="ignore"):
        out, lse = _merge(outs, lses)
    check_finite_output(out)
    return out, lse


def split_kv_attention(q, k, v, *, num_splits, return_lse=False):
    """``attend(q, k, v)`` computed as flash-decoding does: S split into ``num_splits`` parts, their states merged.

    Shapes as :func:`attention_state`. Part i holds keys ``i·S // num_splits`` to
    ``(i+1)·S // num_splits - 1``: contiguous, as equal as possible, empty where
    ``num_splits > S``. Equal to ``attend`` for every ``num_splits >= 1`` up to
    rounding, and bit for bit at ``num_splits = 1``. ``return_lse=True`` also returns
    the lse ``[..., T_q]``, as FlashAttention's ``return_softmax_lse``.
    """
    num_splits, return_lse = as_num_splits(num_splits), as_flag("return_lse", return_lse)
    q, k, v, _ = check_attention_inputs(q, k, v)
    with np.errstate(over="ignore", invalid="ignore"):
        out, lse = _split_kv_attention(q, k, v, num_splits)
    check_finite_output(out)
    return (out, lse) if return_lse else out


def cascade_attention(q, k_shared, v_shared, k_suffix, v_suffix, *, suffix_lengths=None, return_lse=False):
    """Attention of B sequences over one shared prefix and their own suffixes, the prefix read once for all.

    ``q: [B, T_q, D_k]``; the prefix ``k_shared: [S_p, D_k]``, ``v_shared: [S_p, D_v]``;
    the suffixes either as lists of B arrays ``k_suffix[i]: [S_i, D_k]``, ``v_suffix[i]:
    [S_i, D_v]`` (ragged, S_i >= 0), or as arrays ``[B, S_max, D_k]``, ``[B, S_max, D_v]``
    with ``suffix_lengths`` (B integers in [0, S_max]; default all S_max; keys past a
    length get weight exactly 0 whatever they hold, NaN and inf included, and are left
    out of the overflow bound, as :func:`~kv_attention.attention.masked_attend`'s masked
    keys). Returns ``[B, T_q, D_v]`` (and the lse ``[B, T_q]`` with ``return_lse=True``),
    equal up to rounding to sequence i attending over the concatenation of the prefix and its suffix.

    The prefix is attended by all B·T_q query rows in ONE matrix product,
    ``[B·T_q, D_k] x [D_k, S_p]``, so its keys and values are read once rather than
    B times; each suffix state is then merged with the prefix state (FlashInfer's
    two-level cascade). Also raises ValueError for a q that is not 3-D, a number of
    suffixes other than B, or suffix_lengths with lists.
    """
    return_lse = as_flag("return_lse", return_lse)
    q, k_shared, v_shared, k_suffix, v_suffix, lengths, _ = check_cascade_inputs(
        q, k_shared, v_shared, k_suffix, v_suffix, suffix_lengths
    )
    batch, t_q, d_k = q.shape
    d_v = v_shared.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        shared_out, shared_lse = _attention_state(q.reshape(batch * t_q, d_k), k_shared, v_shared)  # [B·T_q, D_v]
        shared = (shared_out.reshape(batch, t_q, d_v), shared_lse.reshape(batch, t_q))  # [B, T_q, D_v], [B, T_q]
        valid = None if lengths is None else (np.arange(k_suffix.shape[1]) < lengths[:, None])[:, None, :]
        suffix = _attention_state(q, k_suffix, v_suffix, valid)  # valid: [B, 1, S_max]
        out, lse = _merge((shared[0], suffix[0]), (shared[1], suffix[1]))
    check_finite_output(out)
    return (out, lse) if return_lse else out
