"""Shared test helpers: an independent, loop-by-loop reference for causal attention."""

import math

import numpy as np
import pytest

import kv_attention as kv

SINGLE = ("no_cache", "concat", "preallocated")  # x: [T, D_model]
BATCHED = ("sequential", "batched")  # x: [B, T, D_model]


def naive_causal_attention(x, w_q, w_k, w_v):
    """Position by position, in float64 with Python's math.exp: shares no code with kv_attention.

    x: [T, D_model] or [B, T, D_model] -> [T, D_v] or [B, T, D_v] (float64).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 3:
        return np.stack([naive_causal_attention(seq, w_q, w_k, w_v) for seq in x]).reshape(
            x.shape[:2] + (np.shape(w_v)[1],)
        )
    w_q, w_k, w_v = (np.asarray(w, dtype=np.float64) for w in (w_q, w_k, w_v))
    t_len, d_k = x.shape[0], w_q.shape[1]
    out = np.zeros((t_len, w_v.shape[1]))
    for t in range(t_len):
        q = x[t] @ w_q
        scores = [float(np.dot(q, x[j] @ w_k)) / math.sqrt(d_k) for j in range(t + 1)]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        for j in range(t + 1):
            out[t] += (weights[j] / total) * (x[j] @ w_v)
    return out


def problem(t_len, batch=None, d_model=4, d_k=3, d_v=5, seed=0, dtype=np.float64):
    """Inputs drawn here (not by kv_attention.make_problem), with D_model, D_k, D_v all different."""
    rng = np.random.default_rng(seed)
    shape = (t_len, d_model) if batch is None else (batch, t_len, d_model)
    x = rng.standard_normal(shape)
    weights = [rng.standard_normal((d_model, d)) / math.sqrt(d_model) for d in (d_k, d_k, d_v)]
    return tuple(a.astype(dtype) for a in (x, *weights))


def strategy_problem(name, t_len, batch=3, **kwargs):
    """A problem shaped for strategy ``name``: batched strategies get ``batch`` sequences."""
    return problem(t_len, batch if name in BATCHED else None, **kwargs)


@pytest.fixture(params=SINGLE + BATCHED)
def strategy(request):
    """Each registered strategy name in turn."""
    return request.param


def run(name, *args, **kwargs):
    return kv.STRATEGIES[name](*args, **kwargs)
