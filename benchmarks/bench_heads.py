"""Heads experiment: MHA, GQA and MQA decode, repeating K/V per query head or attending on grouped views.

The timed multi-head problem, its oracle and its checks are here too, in the
suite, not in ``kv_attention``, for the reason given in ``common.py``: the
package comes from the commit under test and must not supply its own inputs or
its own reference. Commits without the multi-head functions are skipped
(NotImplementedError), so the whole history stays benchmarkable.
"""

import functools
import math
import tracemalloc

import numpy as np

from .common import HEADS_PATHS, SEED, Benchmark, Measured, library_function, read_only, verified_decode
from .counts import Counts

HEADS_BATCH = 4  # B
HEADS_D_MODEL = 128
HEADS_HEAD_DIM = 16  # D_head
HEADS_N_HEADS = 8  # H_q; H_q·D_head = D_model
KINDS = {"mha": 8, "gqa": 2, "mqa": 1}  # attention kind (asv parameter) -> n_kv_heads
HEADS_LENGTHS = [64, 256, 1024]  # T
DECODE_LENGTHS = HEADS_LENGTHS[:2]  # T of HeadsDecode: its T = 1024 cost about 10 s a commit, over the budget


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

    Query head h attends with its own ``w_q`` columns over the ``w_k``/``w_v``
    columns of K/V head ``h // (n_heads // n_kv_heads)`` (as :func:`common.oracle`,
    its scores by BLAS: 3x einsum's speed at T = 1024, where this check costs most);
    the heads are concatenated in order and projected by ``w_o``.
    """
    d, t_len = w_q.shape[1] // n_heads, x.shape[-2]
    future = np.triu(np.ones((t_len, t_len), dtype=bool), k=1)  # [T, S]: key s after query t
    outputs = []
    for h in range(n_heads):
        j = h // (n_heads // n_kv_heads)  # the K/V head of query head h
        q = x @ w_q[:, h * d : (h + 1) * d]  # [..., T, D_head]
        k, v = x @ w_k[:, j * d : (j + 1) * d], x @ w_v[:, j * d : (j + 1) * d]
        scores = np.where(future, -np.inf, q @ k.swapaxes(-1, -2) / math.sqrt(d))  # [..., T, S]
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        outputs.append((weights / weights.sum(axis=-1, keepdims=True)) @ v)  # [..., T, D_head]
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


class PeakBytes:
    """Peak bytes allocated by one call of a decode (tracemalloc, which sees numpy's allocations)."""

    def __init__(self):
        self.peak = None

    def observe(self, decode):
        """``decode``, recording in ``.peak`` what its call allocated at the peak."""
        def traced(*inputs):
            tracemalloc.start()
            try:
                out = decode(*inputs)
                self.peak = tracemalloc.get_traced_memory()[1]
                return out
            finally:
                tracemalloc.stop()

        return traced


class HeadsDecode(Measured):
    """Full T-step decode of B = 4 sequences ``x: [4, T, 128]``, 8 query heads of D_head = 16, float64.

    kind: mha (8 K/V heads), gqa (2), mqa (1). path: repeat_kv copies K/V per
    query head at every step; grouped attends on the cache's own views.

    Every point is checked once, in ``setup_cache`` (an oracle per head costs
    up to 2 s at T = 1024, more than a sample), its checked decode traced for
    the peak bytes; ``setup`` replays the outcome.
    """

    params = [list(KINDS), DECODE_LENGTHS, HEADS_PATHS]
    param_names = ["kind", "T", "path"]
    # One decode per sample, after a warm-up decode: a process's first decode pays the page faults of its first
    # allocations (2.8-3.9x the next at T = 256, repeat_kv), and with it as one of the two samples a process then took,
    # asv's median sat between the two modes, a sample away from either (rows of 1.5-2x between identical commits).
    number = 1
    warmup_time = 0.001
    timeout = 300

    def measure(self, kind, T, path):
        """The point's correctness check with its decode traced: that decode's peak bytes."""
        peak = PeakBytes()
        decode = verified_heads_decode(kind, T, path, observe=peak.observe)
        if peak.peak is None:  # checked before in this process: trace a decode of its own
            peak.observe(decode)(*heads_inputs(kind, T))
        return peak.peak

    def setup(self, measured, kind, T, path):
        super().setup(measured, kind, T, path)
        self.decode = verified_heads_decode(kind, T, path)  # verified in setup_cache: not run again
        self.inputs = heads_inputs(kind, T)

    def time_decode(self, measured, kind, T, path):
        self.decode(*self.inputs)

    # the full T-step multi_head_decode of heads_inputs(kind, T) [4, T, 128], per path, after a warm-up decode
    time_decode.version = "2"

    def track_decode_peak_bytes(self, measured, kind, T, path):
        """Peak bytes allocated during one decode (tracemalloc, which sees numpy's allocations).

        The cache, 2 x 4 x H_kv x T x 16 x 8 bytes, the output [4, T, 128] and the
        per-step temporaries: repeat_kv's copies of K and V, [4, 8, t, 16] each,
        for gqa and mqa. Unlike ``peakmem_``, it excludes the check's oracle: the
        check's own decode, in ``setup_cache``, is the one traced.
        """
        return self.measured

    track_decode_peak_bytes.unit = "bytes"
    # pinned asv hash (9108790): tracemalloc's peak over the check's own decode
    track_decode_peak_bytes.version = "138e91b6a7d3a7ec68828bbdb138afab2bdfc3e8fea1aadd117a30c6813e3119"


class HeadsCacheBytes(Benchmark):
    """Logical K/V cache bytes of the timed problem by ``kv_cache_bytes``: one layer, B = 4, D_head = 16, float64.

    The numbers behind the decode's peak bytes: 2 x 4 x H_kv x T x 16 x 8.
    """

    params = [list(KINDS), HEADS_LENGTHS]
    param_names = ["kind", "T"]

    def setup(self, kind, T):
        self.nbytes = verified_cache_bytes(kind, T)

    def track_kv_cache_bytes(self, kind, T):
        return self.nbytes

    track_kv_cache_bytes.unit = "bytes"
    # pinned asv hash (9108790): kv_cache_bytes of one layer, 2 x 4 x H_kv x T x 16 x 8
    track_kv_cache_bytes.version = "27f1abfbb2b66e26af51c7bdb71b8024fcfb2079bd120139db2880029d6085ac"


class HeadsCounts(Counts):
    """Instructions and estimated cycles of the gqa decode of ``x: [4, 32, 128]`` (8 query heads, 2 K/V), per path."""

    params = [["gqa"], [32], HEADS_PATHS]
    param_names = ["kind", "T", "path"]

    def prepare(self, kind, T, path):
        return verified_heads_decode(kind, T, path), heads_inputs(kind, T)


RATIO_LENGTH = 64  # T of HeadsRatios: a pair at T = 1024 (0.3-1.8 s per decode) would cost seconds
