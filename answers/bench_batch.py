"""The batch experiment's answers: the batch speedup and its per-step times, and the batch-size sweep, paired."""

import statistics

from benchmarks import pairs
from benchmarks.bench_batch import RATIO_LENGTHS
from benchmarks.common import BATCH, SWEEP_BATCH_SIZES, SWEEP_LENGTH, timed_inputs, verified_strategy
from benchmarks.ratios import Ratios, Side


class BatchRatios(Ratios):
    """The batch speedup, sequential / batched, at every T (B = 2): the two decodes timed in turns, paired.

    Beside it, from the same pairs, the time per decode step (one position of each of the B sequences)
    of each side and the time batching saves per step: the medians over the pairs of each side's time
    / T and of (sequential - batched) / T, the saving with its 95 % interval. speedup = 1 + saved /
    batched per step, within the pairs' noise (each is a median of its own).
    """

    params = [RATIO_LENGTHS]
    param_names = ["T"]

    def sides(self, T):
        return (Side(verified_strategy("sequential", T, BATCH), timed_inputs(T, BATCH)),
                Side(verified_strategy("batched", T, BATCH), timed_inputs(T, BATCH)))

    def per_step(self, T):
        """``{"sequential", "batched", "saved"}``: per pair, seconds a step."""
        seq, bat = self.measured["numerator_seconds"], self.measured["denominator_seconds"]
        return {"sequential": [s / T for s in seq], "batched": [b / T for b in bat],
                "saved": [(s - b) / T for s, b in zip(seq, bat)]}

    def track_sequential_step(self, measured, T):
        """Sequential decode's seconds per step: the median over the speedup's pairs."""
        return statistics.median(self.per_step(T)["sequential"])

    track_sequential_step.unit = "seconds"
    track_sequential_step.version = "1"

    def track_batched_step(self, measured, T):
        """Batched decode's seconds per step: the median over the speedup's pairs."""
        return statistics.median(self.per_step(T)["batched"])

    track_batched_step.unit = "seconds"
    track_batched_step.version = "1"

    def track_saved_step(self, measured, T):
        """Seconds batching saves per step: the median of (sequential - batched) / T over the pairs."""
        return pairs.median_interval(self.per_step(T)["saved"])[0]

    track_saved_step.unit = "seconds"
    track_saved_step.version = "1"

    def track_saved_step_low(self, measured, T):
        """The lower end of the saving's distribution-free 95 % interval."""
        return pairs.median_interval(self.per_step(T)["saved"])[1]

    track_saved_step_low.unit = "seconds"
    track_saved_step_low.version = "1"

    def track_saved_step_high(self, measured, T):
        """The upper end of the saving's distribution-free 95 % interval."""
        return pairs.median_interval(self.per_step(T)["saved"])[2]

    track_saved_step_high.unit = "seconds"
    track_saved_step_high.version = "1"


class BatchSizeRatios(Ratios):
    """Positions/s of the batched decode at B over that of B = 1 (T = 128): B x time(B = 1) / time(B), paired."""

    params = [SWEEP_BATCH_SIZES[1:]]
    param_names = ["B"]

    def sides(self, B):
        one = SWEEP_BATCH_SIZES[0]
        return (Side(verified_strategy("batched", SWEEP_LENGTH, one), timed_inputs(SWEEP_LENGTH, one)),
                Side(verified_strategy("batched", SWEEP_LENGTH, B), timed_inputs(SWEEP_LENGTH, B)), B / one)
