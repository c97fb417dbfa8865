"""Split-KV experiment: what the log-sum-exp merge costs in a decode, and what cascade attention saves."""

from .common import Benchmark
from .counts import Counts
from .ratios import Ratios, Side
from .split_inputs import (
    CASCADE_STRATEGIES,
    NUM_SPLITS,
    key_bytes_read,
    prefilled_cache,
    verified_cascade,
    verified_split_decode,
)


class SplitDecode(Benchmark):
    """The last 16 steps of a 2048-position decode of one sequence ``x: [2048, 128]``, gqa (8 query, 2 K/V heads).

    Each timed call decodes positions 2032..2047 over a cache prefilled with the
    first 2032 (made fresh in setup, which asv runs before every timed call).
    num_splits None is ``multi_head_decode`` without it, the baseline; 1, 4 and 16
    split every head's keys into that many parts per step and merge their states.
    """

    params = [NUM_SPLITS]
    param_names = ["num_splits"]
    repeat = (3, 10, 0.2)

    def setup(self, num_splits):
        self.decode, self.inputs = verified_split_decode(num_splits)
        self.cache = prefilled_cache()

    def time_decode(self, num_splits):
        self.decode(*self.inputs, cache=self.cache)
        self.cache.crop(self.cache.get_seq_length() - len(self.inputs[0]))  # back to the prefill, should asv not re-run setup

    time_decode.version = "1"


class CascadeAttention(Benchmark):
    """One decode step of B = 8 sequences sharing a 1024-token prefix, each with a 64-token suffix, D = 64.

    concatenated: each sequence attends over its own copy of prefix and suffix,
    ``[8, 1088, 64]``, as a cache without prefix sharing holds them; cascade: the
    prefix once for all eight queries in one product, merged with each suffix.
    """

    params = [CASCADE_STRATEGIES]
    param_names = ["strategy"]
    repeat = (10, 30, 0.2)
    timeout = 60

    def setup(self, strategy):
        self.attend, self.inputs = verified_cascade(strategy)

    def time_attention(self, strategy):
        self.attend(*self.inputs)

    time_attention.version = "1"

    def track_key_bytes_read(self, strategy):
        """Bytes of keys read, from the input shapes: 8 x 1088 x 64 x 8 concatenated, (1024 + 8 x 64) x 64 x 8 cascade."""
        return key_bytes_read(strategy)

    track_key_bytes_read.unit = "bytes"
    track_key_bytes_read.version = "1"


class CascadeCounts(Counts):
    """Instructions and estimated cycles of one cascade-attention step of the 8 sequences, per strategy.

    The split decode is not counted: each call extends a cache prefilled with 2032 positions,
    so a counted call would have to make that cache again, and count it.
    """

    params = [CASCADE_STRATEGIES]
    param_names = ["strategy"]

    def prepare(self, strategy):
        return verified_cascade(strategy)


def split_side(num_splits):
    """SplitDecode's timed call at ``num_splits``, checked: the last 16 steps, then the cache cropped back."""
    decode, inputs = verified_split_decode(num_splits)
    cache = prefilled_cache()
    return Side(decode, inputs, lambda: cache.crop(cache.get_seq_length() - len(inputs[0])), cache=cache)


class SplitRatios(Ratios):
    """A split-KV decode step at num_splits over the unsplit one: SplitDecode's calls timed in turns, paired."""

    params = [[n for n in NUM_SPLITS if n is not None]]
    param_names = ["num_splits"]

    def setup_cache(self):
        return self.measure_points()

    def sides(self, num_splits):
        return split_side(num_splits), split_side(None)


class CascadeRatios(Ratios):
    """cascade / concatenated: CascadeAttention's two calls timed in turns, paired."""

    params = []
    param_names = []

    def setup_cache(self):
        return self.measure_points()

    def sides(self):
        return Side(*verified_cascade("cascade")), Side(*verified_cascade("concatenated"))
