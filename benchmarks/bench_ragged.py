"""Ragged experiment: 8 sequences of different lengths, padded vs compacted (dynamic exit) vs paged KV cache."""

from .common import STRATEGIES, Benchmark, SkipNotImplemented, check_points, replay
from .counts import Counts
from .ratios import Ratios, Side
from .ragged_inputs import (
    COUNT_DISTRIBUTIONS,
    LENGTH_DISTRIBUTIONS,
    ragged_inputs,
    ragged_stats,
    verified_ragged_decode,
)


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


class RaggedDecode(Benchmark):
    """Full decode of 8 sequences ``x_b: [T_b, 64]``, float64, block_size 16, a pool for the whole batch.

    Every point is checked and its counts taken once, in ``setup_cache``; ``setup`` replays the outcome.
    """

    params = [list(STRATEGIES["ragged"]), list(LENGTH_DISTRIBUTIONS)]
    param_names = ["strategy", "lengths"]
    warmup_time = -1  # asv's own default (0.1 s), as before the base class; RaggedCounts detects finely

    def setup_cache(self):
        return check_points(self.params, check_and_count)

    def setup(self, checked, strategy, lengths):
        self.stats = replay(checked, (strategy, lengths))
        self.decode = verified_ragged_decode(strategy, lengths)  # verified in setup_cache: not run again
        self.inputs = ragged_inputs(lengths)

    def counted(self):
        if self.stats is None:  # the decode is timed; only its counts are missing, so the tracked values skip
            raise SkipNotImplemented("kv_attention.ragged_decode has no return_stats at this commit")
        return self.stats

    def time_decode(self, checked, strategy, lengths):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): the whole ragged_decode of the 8 sequences, per strategy and lengths
    time_decode.version = "b14c0ae8caa1fe29a85b104c320af19812ab3daa0114dd4842f16106378703b5"

    def track_reserved_slots(self, checked, strategy, lengths):
        """K/V token slots reserved at the peak: B x T_max for padded and compacted, peak blocks x 16 for paged."""
        return self.counted()[0]

    track_reserved_slots.unit = "token slots"
    # pinned asv hash (9108790): return_stats' peak_reserved_slots of that decode
    track_reserved_slots.version = "d926deaab3aef882eefbafa1f30234bfe06b11c748e64d904f8504e2a3699e2a"

    def track_row_steps(self, checked, strategy, lengths):
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

    def prepare(self, strategy, lengths):
        return verified_ragged_decode(strategy, lengths), ragged_inputs(lengths)


class RaggedRatios(Ratios):
    """padded / paged and compacted / paged per length distribution: RaggedDecode's decodes timed in turns, paired."""

    params = [[s for s in STRATEGIES["ragged"] if s != "paged"], list(LENGTH_DISTRIBUTIONS)]
    param_names = ["strategy", "lengths"]

    def setup_cache(self):
        return self.measure_points()

    def sides(self, strategy, lengths):
        return (Side(verified_ragged_decode(strategy, lengths), ragged_inputs(lengths)),
                Side(verified_ragged_decode("paged", lengths), ragged_inputs(lengths)))
