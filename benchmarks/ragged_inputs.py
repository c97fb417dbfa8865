"""The ragged experiment's timed inputs, oracle and check: B = 8 sequences of three length distributions.

They live in the suite, not in ``kv_attention``, for the reason given in
``common.py``. The sequences are prefixes of the rows of the timed problem
``timed_inputs(256, 8)``, so every commit decodes the same numbers.
"""

import functools
import inspect
import math

import numpy as np

from .common import library_function, oracle, timed_inputs, verified_decode

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
