"""Ragged experiment: 8 sequences of different lengths, padded vs compacted (dynamic exit) vs paged KV cache.

The timed inputs, oracle and check are here too, in the suite, not in
``kv_attention``, for the reason given in ``common.py``. The sequences are
prefixes of the rows of the timed problem ``timed_inputs(256, 8)``, so every
commit decodes the same numbers.
"""

import functools
import inspect
import math

import numpy as np

from .common import (
    D_K,
    SEED,
    STRATEGIES,
    Measured,
    SkipNotImplemented,
    library_function,
    oracle,
    timed_inputs,
    verified_decode,
)
from .counts import Counts

RAGGED_BATCH = 8  # B
RAGGED_T_MAX = 256
BLOCK_SIZE = 16  # tokens per block of the paged cache
LENGTH_DISTRIBUTIONS = {  # name (asv parameter value) -> T_b of the 8 sequences
    "equal": [256] * 8,
    "uniform": [16, 50, 85, 119, 153, 187, 222, 256],  # evenly spread over 16..256: 16 + b * 240 / 7, rounded
    "skewed": [256] + [16] * 7,
}
COUNT_DISTRIBUTIONS = {  # counted only (RaggedCounts): skewed at a quarter of the length, 5x cheaper under callgrind
    "skewed_64": [64] + [16] * 7,
}
DISTRIBUTIONS = {**LENGTH_DISTRIBUTIONS, **COUNT_DISTRIBUTIONS}


def pool_blocks(distribution):
    """A pool large enough for the whole batch at full length: sum of ceil(T_b / 16) blocks."""
    return sum(math.ceil(n / BLOCK_SIZE) for n in DISTRIBUTIONS[distribution])


@functools.lru_cache(maxsize=None)
def ragged_inputs(distribution):
    """``(seqs, w_q, w_k, w_v)``: seqs a tuple of 8 read-only ``[T_b, 64]`` prefixes of ``timed_inputs(256, 8)``."""
    x, w_q, w_k, w_v = timed_inputs(RAGGED_T_MAX, RAGGED_BATCH)
    seqs = tuple(x[b, :n] for b, n in enumerate(DISTRIBUTIONS[distribution]))  # [T_b, 64] each
    return seqs, w_q, w_k, w_v


def ragged_oracle(seqs, w_q, w_k, w_v):
    """Each sequence alone through the suite's full causal attention: a list of ``[T_b, D_v]``."""
    return [oracle(seq, w_q, w_k, w_v) for seq in seqs]


def ragged_function(strategy, distribution):
    """The commit's ragged_decode bound to ``strategy``, and for paged block_size 16 and the pool; NotImplementedError
    if absent.

    Only "paged" has a pool: the other strategies get neither option, which today's library refuses for them and
    older commits accept either way (they checked, then ignored, both).
    """
    import kv_attention

    function = library_function("ragged_decode")
    if strategy not in getattr(kv_attention, "RAGGED_STRATEGIES", ()):
        raise NotImplementedError(f"kv_attention has no ragged strategy {strategy!r} at this commit")
    options = {"strategy": strategy}
    if strategy == "paged":
        options.update(block_size=BLOCK_SIZE, num_blocks=pool_blocks(distribution))
    return functools.partial(function, **options)


def verified_ragged_decode(strategy, distribution):
    """``ragged_decode`` bound to ``strategy``, every sequence checked against :func:`ragged_oracle`.

    On ``ragged_inputs(distribution)``; outcomes as :func:`common.verified_decode`,
    and NotImplementedError also when the commit lacks the strategy.
    """
    decode = ragged_function(strategy, distribution)
    return verified_decode(f"{strategy}, {distribution}", decode, ragged_inputs(distribution), ragged_oracle)


def ragged_stats(function, inputs):
    """The decode's own counts (``return_stats=True``); NotImplementedError if the commit cannot report them."""
    if "return_stats" not in inspect.signature(function).parameters:
        raise NotImplementedError("kv_attention.ragged_decode has no return_stats at this commit")
    _, stats = function(*inputs, return_stats=True)
    return stats


def check_and_count(strategy, lengths):
    """The point's correctness check, then the decode's own counts: ``(peak_reserved_slots, row_steps)``.

    The counts are None where the commit cannot report them (no ``return_stats``).
    """
    decode = verified_ragged_decode(strategy, lengths)
    try:
        stats = ragged_stats(decode, ragged_inputs(lengths))
    except NotImplementedError:
        return None
    return stats.peak_reserved_slots, stats.row_steps


class RaggedDecode(Measured):
    """Full decode of 8 sequences ``x_b: [T_b, 64]``, float64, block_size 16, a pool for the whole batch.

    Every point is checked and its counts taken once, in ``setup_cache``; ``setup`` replays the outcome.
    """

    params = [list(STRATEGIES["ragged"]), list(LENGTH_DISTRIBUTIONS)]
    param_names = ["strategy", "lengths"]

    measure = staticmethod(check_and_count)

    def setup(self, measured, strategy, lengths):
        super().setup(measured, strategy, lengths)
        self.decode = verified_ragged_decode(strategy, lengths)  # verified in setup_cache: not run again
        self.inputs = ragged_inputs(lengths)

    def counted(self):
        if self.measured is None:  # the decode is timed; only its counts are missing, so the tracked values skip
            raise SkipNotImplemented("kv_attention.ragged_decode has no return_stats at this commit")
        return self.measured

    def time_decode(self, measured, strategy, lengths):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): the whole ragged_decode of the 8 sequences, per strategy and lengths;
    # "-paged-by-block": paged attends block by block through the block tables, no longer gathering (issue 31);
    # "-stored-once": paged reads each stored token once, one attention per length (issue 39)
    time_decode.version = "b14c0ae8caa1fe29a85b104c320af19812ab3daa0114dd4842f16106378703b5-stored-once"

    def track_reserved_slots(self, measured, strategy, lengths):
        """K/V token slots reserved at the peak: B x T_max for padded and compacted, peak blocks x 16 for paged."""
        return self.counted()[0]

    track_reserved_slots.unit = "token slots"
    # pinned asv hash (9108790): return_stats' peak_reserved_slots of that decode
    track_reserved_slots.version = "d926deaab3aef882eefbafa1f30234bfe06b11c748e64d904f8504e2a3699e2a"

    def track_row_steps(self, measured, strategy, lengths):
        """Query rows computed over the decode: B x T_max for padded, the sum of T_b for compacted and paged."""
        return self.counted()[1]

    track_row_steps.unit = "row-steps"
    # pinned asv hash (9108790): return_stats' row_steps of that decode
    track_row_steps.version = "5068cf4ee0f2d51db6946cbd8037cd176e62b52ab61f8ec1f383d22c100c44d1"


class RaggedCounts(Counts):
    """Instructions and estimated cycles of the decode of 8 skewed sequences, T_b = 64 and 7 x 16, per strategy.

    The timed skewed batch at a quarter of its longest length: counting the timed one took 35 s under callgrind.
    """

    params = [list(STRATEGIES["ragged"]), list(COUNT_DISTRIBUTIONS)]
    param_names = ["strategy", "lengths"]
    # 4: paged attends block by block through the block tables, no longer gathering (issue 31);
    # 5: paged reads each stored token once, one attention per length (issue 39); 6: Counts' version 4
    version = "6"

    def prepare(self, strategy, lengths):
        return verified_ragged_decode(strategy, lengths), ragged_inputs(lengths)


# One paged step on a skewed batch (issue 39): point -> (the other side, T of the long sequence)
PAGED_STEP = {"gather_2048": ("gather", 2048), "padded_8192": ("padded", 8192)}
STEP_SHORT = [64] * 7  # the 7 short sequences beside the long one


@functools.lru_cache(maxsize=None)
def paged_step_inputs(t_long):
    """``(q [8, 1, 64], ks, vs)``, float32: the query of each sequence and its K and V ``[T_b, 64]``, T_b = t_long,
    then 64 seven times."""
    rng = np.random.default_rng(SEED)
    lengths = [t_long] + STEP_SHORT
    ks, vs = ([rng.standard_normal((n, D_K), dtype=np.float32) for n in lengths] for _ in range(2))
    return rng.standard_normal((len(lengths), 1, D_K), dtype=np.float32), ks, vs


def paged_step_reference(q, ks, vs):
    """Each sequence's attention alone, float64: ``[8, 1, 64]``."""
    out = []
    for q_i, k, v in zip(q.astype(np.float64), ks, vs):
        scores = q_i @ k.T.astype(np.float64) / math.sqrt(D_K)
        weights = np.exp(scores - scores.max())
        out.append(weights / weights.sum() @ v)
    return np.array(out)


@functools.lru_cache(maxsize=None)
def paged_step_sides(t_long):
    """``{"paged", "padded", "gather"}``: one step of the commit's paged_attention over a PagedKVCache (block 16),
    masked_attend over the batch padded to ``t_long``, and a minimal gather (each sequence's blocks fancy-indexed
    once through its block table, then its attention); each checked against :func:`paged_step_reference`."""
    import kv_attention as kv

    if "dtype" not in inspect.signature(getattr(kv, "PagedKVCache", lambda: None)).parameters:
        raise NotImplementedError("kv_attention has no float32 PagedKVCache at this commit")
    paged_attention, masked_attend = library_function("paged_attention"), library_function("masked_attend")
    q, ks, vs = paged_step_inputs(t_long)
    lengths, ids = [len(k) for k in ks], list(range(len(ks)))
    pool = kv.PagedKVCache(sum(math.ceil(n / BLOCK_SIZE) for n in lengths), BLOCK_SIZE, D_K, D_K, dtype=np.float32)
    k_pad, v_pad = np.zeros((2, len(ks), t_long, D_K), np.float32)
    valid = np.arange(t_long) < np.array(lengths)[:, None]  # [8, t_long]
    for i, (k, v) in enumerate(zip(ks, vs)):
        pool.add_sequence(i)
        pool.update([i], k[None], v[None])
        k_pad[i, : len(k)], v_pad[i, : len(v)] = k, v

    def gather():
        out = np.empty((len(ks), 1, D_K), np.float32)
        for i, n in enumerate(lengths):
            table = list(pool.block_table(i))
            k, v = pool.k_cache[table].reshape(-1, D_K)[:n], pool.v_cache[table].reshape(-1, D_K)[:n]
            scores = q[i] @ k.T / np.float32(math.sqrt(D_K))
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            out[i] = weights / weights.sum(-1, keepdims=True) @ v
        return out

    steps = {"paged": functools.partial(paged_attention, q, pool, ids), "gather": gather,
             "padded": functools.partial(masked_attend, q, k_pad, v_pad, valid)}
    expected = paged_step_reference(q, ks, vs)
    for name, step in steps.items():  # float32: rounding of order 1e-7 relative
        np.testing.assert_allclose(step(), expected, rtol=1e-4, atol=1e-5, err_msg=f"{name}, 1 x {t_long} + 7 x 64")
    return steps
