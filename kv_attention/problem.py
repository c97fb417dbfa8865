"""A seeded decode problem: inputs, projection weights and a token embedding table, for users and tests.

A size or seed below its minimum raises ValueError; a size or seed that is not an
integer, or a dtype other than float32/float64 (None included), raises TypeError.
"""

from dataclasses import dataclass

import numpy as np

from ._validation import as_float_dtype, as_size


@dataclass(frozen=True)
class Problem:
    """Inputs of one decode run: ``x [T, D_model]`` or ``[B, T, D_model]``, ``w_q, w_k [D_model, D_k]``, ``w_v
    [D_model, D_v]``, and ``embedding [V, D_model]`` (None unless asked for): a request's input is
    ``embedding[token_ids]``."""

    x: np.ndarray
    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    embedding: np.ndarray | None = None

    def args(self):
        """``(x, w_q, w_k, w_v)``, the positional arguments of every strategy."""
        return self.x, self.w_q, self.w_k, self.w_v

    def __repr__(self):
        """The shapes and the dtype, never the arrays: ``Problem(x=[16, 64], ..., dtype=float64)``."""
        arrays = {"x": self.x, "w_q": self.w_q, "w_k": self.w_k, "w_v": self.w_v}
        if self.embedding is not None:
            arrays["embedding"] = self.embedding
        dtypes = {name: str(getattr(a, "dtype", type(a).__name__)) for name, a in arrays.items()}
        if len(set(dtypes.values())) == 1:
            shapes = ", ".join(f"{name}={list(np.shape(a))}" for name, a in arrays.items())
            return f"Problem({shapes}, dtype={dtypes['x']})"
        return f"Problem({', '.join(f'{name}={dtypes[name]}{list(np.shape(a))}' for name, a in arrays.items())})"


def make_problem(seq_len, batch_size=None, *, d_model=64, d_k=64, d_v=64, seed=42, dtype=np.float64,
                 vocab_size=None):
    """A reproducible problem of ``np.random.default_rng(seed)`` (an integer >= 0: None would draw another each call).

    ``x`` (``[seq_len, d_model]``, or ``[batch_size, seq_len, d_model]``) and the embedding (``vocab_size`` rows)
    are standard normal, each weight normal of variance 1 / D_model, so q·k / sqrt(D_k) stays of order 1; drawn in
    the order x, w_q, w_k, w_v, embedding, so that ``vocab_size`` changes nothing else. ``d_k`` >= 1.
    """
    seed = as_size("seed", seed)  # None would draw a problem no one can draw again
    seq_len, d_model, d_v = (as_size(n, v) for n, v in (("seq_len", seq_len), ("d_model", d_model), ("d_v", d_v)))
    d_k = as_size("d_k", d_k, minimum=1)
    if batch_size is not None:
        batch_size = as_size("batch_size", batch_size)
    dtype = as_float_dtype(dtype)
    if vocab_size is not None:
        vocab_size = as_size("vocab_size", vocab_size, minimum=1)
    x_shape = (seq_len, d_model) if batch_size is None else (batch_size, seq_len, d_model)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    scale = 1.0 / np.sqrt(max(d_model, 1))
    w_q, w_k, w_v = (rng.standard_normal((d_model, d)) * scale for d in (d_k, d_k, d_v))
    embedding = None if vocab_size is None else rng.standard_normal((vocab_size, d_model)).astype(dtype)
    return Problem(*(a.astype(dtype) for a in (x, w_q, w_k, w_v)), embedding=embedding)
