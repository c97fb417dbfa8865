"""What the library's scans of every element cost: a public call with its default checks over ``check_finite=False``.

Every other benchmark times and counts the mechanism with ``check_finite=False``
where the commit has the keyword (``common.library_function``). These ratios
say what the NaN/inf and overflow scans, which a caller gets by default, add
to a call: the default and ``check_finite=False`` timed in turns, paired
(``ratios.py``). A commit without the keyword skips (n/a): its calls always scan.
"""

import math

import numpy as np

from benchmarks.common import library_function, oracle, read_only, takes_check_finite, timed_inputs, verified_decode
from benchmarks.ratios import Ratios, Side

ATTEND_SHAPES = ((1, 1, 8), (1, 4, 8))  # q [B, 1, D], k and v [B, S, D]: the tiny public attend
CACHED_LENGTH = 64  # T of the cached decode


def attend_inputs():
    """``(q, k, v)``, float64, read-only: q ``[1, 1, 8]``, k and v ``[1, 4, 8]``, from ``default_rng(42)``."""
    rng = np.random.default_rng(42)
    q_shape, kv_shape = ATTEND_SHAPES
    return read_only(rng.standard_normal(q_shape), rng.standard_normal(kv_shape), rng.standard_normal(kv_shape))


def attend_oracle(q, k, v):
    """softmax(q kᵀ / sqrt(D)) v over every key, written here: ``[B, 1, D]``."""
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # [B, 1, S]
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


CALLS = {  # asv parameter -> (public function, its inputs, the suite's oracle)
    "attend": ("attend", attend_inputs, attend_oracle),
    "cached_attention": ("cached_attention", lambda: timed_inputs(CACHED_LENGTH), oracle),
}


class CheckFiniteRatios(Ratios):
    """A public call with its default checks over the same call with ``check_finite=False``: the scans' cost, paired.

    attend: one step on ``q [1, 1, 8]``, ``k, v [1, 4, 8]``, where the checks weigh most;
    cached_attention: the cache experiment's full decode of ``[64, 64]``.
    """

    params = [list(CALLS)]
    param_names = ["call"]

    def sides(self, call):
        name, inputs, reference = CALLS[call]
        checked = library_function(name, check_finite=True)
        if not takes_check_finite(checked):
            raise NotImplementedError(f"kv_attention.{name} has no check_finite at this commit")
        unchecked = library_function(name)
        for what, function in (("default", checked), ("check_finite=False", unchecked)):
            verified_decode(f"{name}, {what}", function, inputs(), reference)
        return Side(checked, inputs()), Side(unchecked, inputs())
