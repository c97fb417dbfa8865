"""The quantized cache experiment's answers: its decode over a DynamicCache's, and attention from the codes over
dequantize-then-attend, paired."""

from benchmarks.bench_quantized import KINDS, LENGTHS, STEP_LENGTHS, prefilled, quantized_cache, steps, verified_kind
from benchmarks.common import library_function, timed_inputs, verified_strategy
from benchmarks.ratios import Ratios, Side


def fresh(cache):
    """The cache emptied after each timed call (crop(0)), so every call decodes from an empty cache."""
    return lambda: cache.crop(0)


class QuantizedRatios(Ratios):
    """The decode through a QuantizedCache over the same decode through a DynamicCache, timed in turns, paired."""

    params = [LENGTHS, list(KINDS)]
    param_names = ["T", "kind"]
    seconds = 0.1  # at least MIN_PAIRS pairs: a 128-step decode fills a sample alone

    def sides(self, T, kind):
        verified_kind(kind, T)
        decode, inputs = verified_strategy("concat", T), timed_inputs(T)
        quantized, dynamic = quantized_cache(kind), library_function("DynamicCache")()
        return (Side(decode, inputs, after=fresh(quantized), cache=quantized),
                Side(decode, inputs, after=fresh(dynamic), cache=dynamic))


class FusedRatios(Ratios):
    """One attention step over a cache of T positions: attend_quantized over dequantize-then-attend, paired."""

    params = [STEP_LENGTHS, list(KINDS)]
    param_names = ["T", "kind"]
    seconds = 0.05  # MIN_PAIRS pairs of one sample (>= 2 ms) a side
    burst = 1

    def sides(self, T, kind):
        q, cache = prefilled(kind, T)
        step = steps()
        return Side(step["fused"], (q, cache)), Side(step["dequantized"], (q, cache))
