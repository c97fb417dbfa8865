"""Single-head scaled dot-product attention: the full causal reference and one decode step, masked or not.

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

Method: softmax(q kᵀ / sqrt(D_k) + causal mask) v, from Vaswani et al. 2017,
"Attention Is All You Need", section 3.2.1.
"""

import math

import numpy as np

from ._validation import check_attention_inputs, check_finite_output, check_projection_inputs


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


def attend(q, k, v):
    """One attention step with no mask: softmax(q kᵀ / sqrt(D_k)) v, ``[..., T_q, D_v]``.

    ``q: [..., T_q, D_k]`` attends to every key of ``k: [..., S, D_k]``, ``v: [..., S,
    D_v]``: a decode step passes the keys written so far, which need no causal
    mask. q, k and v share their leading axes; S >= 1, D_k >= 1.
    """
    q, k, v, _ = check_attention_inputs(q, k, v)
    return _attend(q, k, v)


def masked_attend(q, k, v, valid):
    """:func:`attend` over the keys that ``valid: [..., S]`` (bool, a key-padding mask) marks True.

    Every query of a row sees the same keys, as in a ragged batch where row n
    holds a sequence of ``valid[n].sum()`` positions. The mask is applied by
    selection (``np.where``) before the softmax, so a masked key gets weight
    exactly 0 whatever it holds, and a row with no valid key (S = 0 included)
    gives zeros, never NaN; with every key valid this is :func:`attend`. The
    overflow bounds take the valid keys only.
    """
    q, k, v, valid = check_attention_inputs(q, k, v, valid)
    if k.shape[-2] == 0:
        return np.zeros(q.shape[:-1] + v.shape[-1:], np.result_type(q, k, v))  # [..., T_q, D_v]
    return _masked_attend(q, k, v, valid)


def _attend(q, k, v):
    """Unchecked core of :func:`attend` (inputs already validated)."""
    scores = q @ k.swapaxes(-1, -2)  # [..., T_q, S]
    scores *= 1.0 / math.sqrt(q.shape[-1])
    return softmax(scores) @ v  # [..., T_q, D_v]


def _masked_attend(q, k, v, valid):
    """Unchecked core of :func:`masked_attend`; ``valid: [..., S]``, S >= 1."""
    if valid.all():
        return _attend(q, k, v)
    with np.errstate(over="ignore", invalid="ignore"):
        scores = q @ k.swapaxes(-1, -2)  # [..., T_q, S]
        scores *= 1.0 / math.sqrt(q.shape[-1])
    scores = np.where(valid[..., None, :], scores, -np.inf)  # the mask, by selection: no arithmetic on masked scores
    row_max = scores.max(axis=-1, keepdims=True)  # [..., T_q, 1]; -inf for a row with nothing to attend to
    row_max[~valid.any(axis=-1)] = 0.0
    weights = np.exp(scores - row_max)  # masked keys: exp(-inf) = 0
    total = weights.sum(axis=-1, keepdims=True)
    weights /= np.where(total > 0, total, 1.0)
    return weights @ v  # [..., T_q, D_v]


def _causal_attention(x, w_q, w_k, w_v):
    """Unchecked core of :func:`causal_attention` (inputs already validated)."""
    t_len, d_v = x.shape[-2], w_v.shape[1]
    if t_len == 0:
        return np.empty(x.shape[:-1] + (d_v,), dtype=np.result_type(x, w_v))
    q = x @ w_q  # [..., T, D_k]
    k = x @ w_k  # [..., T, D_k]
    v = x @ w_v  # [..., T, D_v]
    scores = q @ k.swapaxes(-1, -2)  # [..., T, T]
    scores *= 1.0 / math.sqrt(q.shape[-1])
    future = np.triu(np.ones((t_len, t_len), dtype=bool), k=1)  # [T, T], True above the diagonal
    scores[..., future] = -np.inf
    return softmax(scores) @ v  # [..., T, D_v]


def causal_attention(x, w_q, w_k, w_v):
    """Causal self-attention over the whole sequence at once: the reference.

    Position t attends to positions 0..t. This is what prefill computes and what
    every decode strategy must reproduce position by position. T = 0 gives an
    empty array.
    """
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2, 3))
    with np.errstate(over="ignore", invalid="ignore"):
        out = _causal_attention(x, w_q, w_k, w_v)
    check_finite_output(out)
    return out
