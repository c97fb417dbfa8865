"""Single-head scaled dot-product attention: the full causal reference and one decode step.

Axis letters used in names and shape comments:
    B  batch (independent sequences)     T  sequence length (positions)
    S  key positions attended to         D  feature width (D_model, D_k, D_v)
Leading ``...`` axes are batch-like and never mixed.

:func:`causal_attention` takes ``x: [T, D_model]`` or ``[B, T, D_model]``, ``w_q, w_k:
[D_model, D_k]``, ``w_v: [D_model, D_v]``, float32 or float64, and returns ``[..., T, D_v]``
in ``np.result_type`` of the inputs (float32 only when every input is float32).
Bad input raises TypeError (an input that is not a float32/float64 array) or
ValueError (shapes that do not fit, named in the message; NaN/inf; scores that
overflow the dtype).

Method: softmax(q kᵀ / sqrt(D_k) + causal mask) v, from Vaswani et al. 2017,
"Attention Is All You Need", section 3.2.1.
"""

import math

import numpy as np

from ._validation import check_finite_output, check_projection_inputs


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
    """Attention of ``q: [..., T_q, D_k]`` over ``k: [..., S, D_k]``, ``v: [..., S, D_v]``, with no mask.

    A decode step passes only the keys written so far, so it needs no causal mask.
    """
    scores = q @ k.swapaxes(-1, -2)  # [..., T_q, S]
    scores *= 1.0 / math.sqrt(q.shape[-1])
    return softmax(scores) @ v  # [..., T_q, D_v]


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
