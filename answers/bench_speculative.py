"""The speculative decoding experiment's answer: the wall-clock speedup of prompt lookup, paired."""

from benchmarks.bench_speculative import SPEEDUP_K, decode
from benchmarks.ratios import FEWEST_PAIRS, Ratios, Side


class SpeculativeRatios(Ratios):
    """Plain greedy / prompt lookup at k = 10: the time of the same NEW_TOKENS tokens, paired (above 1: faster)."""

    params = [["copy"]]
    param_names = ["prompt"]
    version = "1"
    min_pairs = FEWEST_PAIRS  # a pair is 1-2 s of the whole model
    seconds = 0

    def sides(self, prompt):
        return Side(decode(prompt), ()), Side(decode(prompt, SPEEDUP_K), ())
