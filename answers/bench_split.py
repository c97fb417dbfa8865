"""The split-KV experiment's answers: a split decode over the unsplit one, and cascade over concatenated, paired."""

from benchmarks.bench_split import NUM_SPLITS, prefilled_cache, verified_cascade, verified_split_decode
from benchmarks.ratios import Ratios, Side


def split_side(num_splits):
    """SplitDecode's timed call at ``num_splits``, checked: the last 16 steps, then the cache cropped back."""
    decode, inputs = verified_split_decode(num_splits)
    cache = prefilled_cache()
    return Side(decode, inputs, lambda: cache.crop(cache.get_seq_length() - len(inputs[0])), cache=cache)


class SplitRatios(Ratios):
    """A split-KV decode step at num_splits over the unsplit one: SplitDecode's calls timed in turns, paired."""

    params = [[n for n in NUM_SPLITS if n is not None]]
    param_names = ["num_splits"]

    def sides(self, num_splits):
        return split_side(num_splits), split_side(None)


class CascadeRatios(Ratios):
    """cascade / concatenated: CascadeAttention's two calls timed in turns, paired."""

    params = []
    param_names = []

    def sides(self):
        return Side(*verified_cascade("cascade")), Side(*verified_cascade("concatenated"))
