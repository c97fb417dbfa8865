"""What the heads benchmarks share: the timed multi-head problem, its oracle and its checks.

Like ``common.py``, these live in the suite, not in ``kv_attention``: the
package comes from the commit under test and must not supply its own inputs or
its own reference. Commits without the multi-head functions are skipped
(NotImplementedError), so the whole history stays benchmarkable.
"""

import functools
import math

import numpy as np

from .common import HEADS_PATHS, SEED, library_function, oracle, read_only, verified_decode

HEADS_BATCH = 4  # B
HEADS_D_MODEL = 128
HEADS_HEAD_DIM = 16  # D_head
HEADS_N_HEADS = 8  # H_q; H_q·D_head = D_model
KINDS = {"mha": 8, "gqa": 2, "mqa": 1}  # attention kind (asv parameter) -> n_kv_heads
HEADS_LENGTHS = [64, 256, 1024]  # T


@functools.lru_cache(maxsize=None)
def heads_inputs(kind, t_len):
    """The timed problem ``(x, w_q, w_k, w_v, w_o)``, float64, read-only, identical for every commit.

    From ``default_rng(42)`` in this order: x ``[4, T, 128]`` standard normal;
    w_q ``[128, 8·16]`` and w_o ``[8·16, 128]``, then w_k and w_v
    ``[128, H_kv·16]``, all normal with variance 1/128. So x, w_q and w_o are
    the same for mha, gqa and mqa at a given T.
    """
    n_kv_heads = KINDS[kind]
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((HEADS_BATCH, t_len, HEADS_D_MODEL))
    shapes = [
        (HEADS_D_MODEL, HEADS_N_HEADS * HEADS_HEAD_DIM),  # w_q
        (HEADS_N_HEADS * HEADS_HEAD_DIM, HEADS_D_MODEL),  # w_o
        (HEADS_D_MODEL, n_kv_heads * HEADS_HEAD_DIM),  # w_k
        (HEADS_D_MODEL, n_kv_heads * HEADS_HEAD_DIM),  # w_v
    ]
    w_q, w_o, w_k, w_v = (rng.standard_normal(shape) / math.sqrt(shape[0]) for shape in shapes)
    return read_only(x, w_q, w_k, w_v, w_o)


def heads_oracle(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """Multi-head causal attention written independently of kv_attention: ``[..., T, D_out]``.

    Query head h is :func:`common.oracle` on its own ``w_q`` columns and on the
    ``w_k``/``w_v`` columns of K/V head ``h // (n_heads // n_kv_heads)``; the heads
    are concatenated in order and projected by ``w_o``.
    """
    d = w_q.shape[1] // n_heads
    outputs = []
    for h in range(n_heads):
        j = h // (n_heads // n_kv_heads)  # the K/V head of query head h
        q_cols, kv_cols = slice(h * d, (h + 1) * d), slice(j * d, (j + 1) * d)
        outputs.append(oracle(x, w_q[:, q_cols], w_k[:, kv_cols], w_v[:, kv_cols]))  # [..., T, D_head]
    return np.concatenate(outputs, axis=-1) @ w_o  # [..., T, H_q·D_head] -> [..., T, D_out]


@functools.lru_cache(maxsize=None)
def heads_expected(kind, t_len):
    """:func:`heads_oracle` on ``heads_inputs(kind, t_len)``, computed once for both paths: ``[4, T, 128]``."""
    return heads_oracle(*heads_inputs(kind, t_len), n_heads=HEADS_N_HEADS, n_kv_heads=KINDS[kind])


def verified_heads_decode(kind, t_len, path, observe=None):
    """``multi_head_decode`` with n_heads, n_kv_heads and ``path`` bound, checked against :func:`heads_oracle`.

    rtol = atol = 1e-8, on ``heads_inputs(kind, t_len)``; outcomes as :func:`common.verified_decode`.
    ``observe``, if given, wraps the decode for the check's call only (to measure that call).
    """
    decode = functools.partial(
        library_function("multi_head_decode"), n_heads=HEADS_N_HEADS, n_kv_heads=KINDS[kind], path=path
    )
    key = f"{path} {kind} at T={t_len}"
    checked = decode if observe is None else observe(decode)
    verified_decode(key, checked, heads_inputs(kind, t_len), lambda *_: heads_expected(kind, t_len),
                    rtol=1e-8, atol=1e-8)
    return decode


def verified_cache_bytes(kind, t_len):
    """The logical K/V bytes of the timed problem by the commit's ``kv_cache_bytes``, checked.

    Expected: 2 × B × H_kv × T × D_head × 8 bytes (one layer, float64).
    NotImplementedError when the commit lacks the function; AssertionError when it differs.
    """
    kv_cache_bytes = library_function("kv_cache_bytes")
    shape = dict(n_layers=1, n_kv_heads=KINDS[kind], head_dim=HEADS_HEAD_DIM, dtype=np.float64)
    got = kv_cache_bytes(batch=HEADS_BATCH, seq_len=t_len, **shape)
    expected = 2 * HEADS_BATCH * KINDS[kind] * t_len * HEADS_HEAD_DIM * 8
    assert got == expected, f"kv_cache_bytes for {kind} at T={t_len}: {got}, expected {expected}"
    return got
