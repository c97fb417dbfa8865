"""Shared test helpers: an independent, loop-by-loop reference for causal attention, and tools/dev.py."""

import importlib.util
import math
import subprocess
from pathlib import Path

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


DEV_PY = Path(__file__).resolve().parents[1] / "tools" / "dev.py"
PACKAGE = {"setup.cfg": "[metadata]", "pyproject.toml": "", "kv_attention/__init__.py": ""}


@pytest.fixture
def dev(monkeypatch, tmp_path):
    """tools/dev.py imported as a module, pointed at an empty git repository in tmp_path."""
    spec = importlib.util.spec_from_file_location("dev_tool", DEV_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q", "-b", "main"], check=True)

    def commit(message, files):
        for name, text in files.items():
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", message], check=True)
        return subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    module.commit = commit
    return module


# Multi-head attention (kv_attention.heads): n_heads = 6, n_kv_heads = 2 by default.

HEADS_PATHS = ("grouped", "repeat_kv")


def heads_problem(t_len, batch=3, *, n_heads=6, n_kv_heads=2, d_model=5, head_dim=3, d_out=4, seed=0,
                  dtype=np.float64):
    """(x, w_q, w_k, w_v, w_o), drawn here, with D_model, head_dim and D_out all different."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t_len, d_model) if batch is None else (batch, t_len, d_model))
    widths = (n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim)
    w_q, w_k, w_v = (rng.standard_normal((d_model, w)) / math.sqrt(d_model) for w in widths)
    w_o = rng.standard_normal((n_heads * head_dim, d_out)) / math.sqrt(n_heads * head_dim)
    return tuple(a.astype(dtype) for a in (x, w_q, w_k, w_v, w_o))


def naive_head(x, w_q, w_k, w_v, h, n_heads, n_kv_heads, kv_of=None):
    """Query head h alone, by the loop-by-loop single-head reference: ``[..., T, D_head]``.

    K/V head of h: ``h // (n_heads // n_kv_heads)``, or ``kv_of(h)`` when given.
    """
    d = w_q.shape[1] // n_heads
    j = h // (n_heads // n_kv_heads) if kv_of is None else kv_of(h)
    kv_cols = slice(j * d, (j + 1) * d)
    return naive_causal_attention(x, w_q[:, h * d : (h + 1) * d], w_k[:, kv_cols], w_v[:, kv_cols])


def naive_multi_head(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """Every head by :func:`naive_head`, concatenated in head order, then ``@ w_o``."""
    per_head = [naive_head(x, w_q, w_k, w_v, h, n_heads, n_kv_heads) for h in range(n_heads)]
    return np.concatenate(per_head, axis=-1) @ np.asarray(w_o, dtype=np.float64)


def heads_reference(*args, n_heads=6, n_kv_heads=2):
    return kv.multi_head_attention(*args, n_heads=n_heads, n_kv_heads=n_kv_heads)


def heads_decode(*args, n_heads=6, n_kv_heads=2, path="grouped", **kwargs):
    return kv.multi_head_decode(*args, n_heads=n_heads, n_kv_heads=n_kv_heads, path=path, **kwargs)


HEADS_FUNCTIONS = {
    "reference": heads_reference,
    "grouped": heads_decode,
    "repeat_kv": lambda *args, **kw: heads_decode(*args, path="repeat_kv", **kw),
}


@pytest.fixture(params=sorted(HEADS_FUNCTIONS))
def heads_function(request):
    """multi_head_attention, and multi_head_decode on each path."""
    return HEADS_FUNCTIONS[request.param]
