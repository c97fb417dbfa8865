"""A seeded decode problem: inputs, projection weights and a token embedding table, for users and tests.

A size or seed below its minimum raises ValueError; a size or seed that is not an
integer, or a dtype other than float32/float64 (None included), raises TypeError.
"""

from dataclasses import dataclass

import numpy as np

from ._validation import as_float_dtype, as_size


@dataclass(frozen=True)
class Problem:
    """Inputs of one decode run.

    Attributes:
        x: ``[T, D_model]`` or ``[B, T, D_model]``.
        w_q: ``[D_model, D_k]``. w_k: ``[D_model, D_k]``. w_v: ``[D_model, D_v]``.
        embedding: ``[V, D_model]``, the token embedding table of ``vocab_size=V``
            (None unless asked for): a request's model input is ``embedding[token_ids]``.
    """

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
    """Draw a reproducible problem from ``np.random.default_rng(seed)``.

    ``x`` is standard normal; each weight is normal with variance 1 / D_model,
    so q·k / sqrt(D_k) stays of order 1 at any width. Draw order: x, w_q, w_k, w_v,
    then the embedding (standard normal, like x), so x and the weights do not
    depend on ``vocab_size``.

    Args:
        seq_len: T >= 0.
        batch_size: None for ``x: [T, D_model]``, else B >= 0 for ``[B, T, D_model]``.
        d_model, d_k, d_v: widths (defaults 64, as in the lab); d_k >= 1.
        seed: the generator's seed, an integer >= 0 (default 42); None, a bool or a
            float is a TypeError (None would draw a different problem each call).
        dtype: float32 or float64 (default float64).
        vocab_size: None (default, no embedding) or V >= 1 for ``embedding: [V, D_model]``.
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
    return _draw(np.random.default_rng(seed), x_shape, d_model, d_k, d_v, vocab_size, dtype)


def _draw(rng, x_shape, d_model, d_k, d_v, vocab_size, dtype):
    x = rng.standard_normal(x_shape)
    scale = 1.0 / np.sqrt(max(d_model, 1))
    w_q, w_k, w_v = (rng.standard_normal((d_model, d)) * scale for d in (d_k, d_k, d_v))
    embedding = None if vocab_size is None else rng.standard_normal((vocab_size, d_model)).astype(dtype)
    return Problem(*(a.astype(dtype) for a in (x, w_q, w_k, w_v)), embedding=embedding)
