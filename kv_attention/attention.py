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

from ._validation import check_attention_inputs, check_finite_output, check_projection_inputs, check_window


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
    mask. q, k and v share their leading axes; D_k >= 1; S = 0 gives zeros.
    """
    q, k, v, dtype = check_attention_inputs(q, k, v)
    if k.shape[-2] == 0:  # no key: zeros, the identity of attention states (split.attention_state)
        return np.zeros(q.shape[:-1] + v.shape[-1:], dtype)  # [..., T_q, D_v]
    return _attend(q, k, v)


def masked_attend(q, k, v, valid):
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
    q, k, v, dtype = check_attention_inputs(q, k, v, valid)
    if k.shape[-2] == 0:
        return np.zeros(q.shape[:-1] + v.shape[-1:], dtype)  # [..., T_q, D_v]
    return _masked_attend(q, k, v, np.asarray(valid))


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


def _causal_attention(x, w_q, w_k, w_v, blocked=None):
    """Unchecked core of :func:`causal_attention` (inputs already validated).

    ``blocked: [T, T]`` bool is True where position t may not attend position s;
    by default s > t (the causal mask).
    """
    t_len, d_v = x.shape[-2], w_v.shape[1]
    if t_len == 0:
        return np.empty(x.shape[:-1] + (d_v,), dtype=np.result_type(x, w_v))
    q = x @ w_q  # [..., T, D_k]
    k = x @ w_k  # [..., T, D_k]
    v = x @ w_v  # [..., T, D_v]
    scores = q @ k.swapaxes(-1, -2)  # [..., T, T]
    scores *= 1.0 / math.sqrt(q.shape[-1])
    future = np.triu(np.ones((t_len, t_len), dtype=bool), k=1) if blocked is None else blocked  # [T, T]
    scores[..., future] = -np.inf
    return softmax(scores) @ v  # [..., T, D_v]


def causal_attention(x, w_q, w_k, w_v, *, window=None, n_sink=0):
    """Causal self-attention over the whole sequence at once: the reference.

    Position t attends to positions 0..t, or with ``window``/``n_sink`` to the
    banded subset of the module docstring. This is what prefill computes and what
    every decode strategy (and ``chunked_attention``, with the same window) must
    reproduce position by position. T = 0 gives an empty array.
    """
    window, n_sink = check_window(window, n_sink)
    x, w_q, w_k, w_v, _ = check_projection_inputs(x, w_q, w_k, w_v, x_ndims=(2, 3))
    positions = np.arange(x.shape[-2])
    blocked = None if window is None else ~band_mask(positions, positions, window, n_sink)  # [T, T]
    with np.errstate(over="ignore", invalid="ignore"):
        out = _causal_attention(x, w_q, w_k, w_v, blocked)
    check_finite_output(out)
    return out
