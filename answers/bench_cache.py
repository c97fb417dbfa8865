"""The cache experiment's answer: what recomputing, and what concatenating, cost over a preallocated cache, paired."""

from benchmarks.common import LENGTHS, timed_inputs, verified_strategy
from benchmarks.ratios import Ratios, Side


class CacheRatios(Ratios):
    """no_cache / preallocated and concat / preallocated at every T: the two decodes timed in turns, paired.

    What recomputing every step, and what concatenating into a growing cache,
    cost over writing into a preallocated one, on CacheStrategy's problem.
    """

    params = [LENGTHS, ["no_cache", "concat"]]
    param_names = ["T", "strategy"]

    def sides(self, T, strategy):
        return (Side(verified_strategy(strategy, T), timed_inputs(T)),
                Side(verified_strategy("preallocated", T), timed_inputs(T)))
