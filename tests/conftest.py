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
