"""Batch experiment: B sequences decoded one after another vs together, and a batch-size sweep."""

from .common import BATCH, Benchmark, LENGTHS, STRATEGIES, SWEEP_BATCH_SIZES, SWEEP_LENGTH, timed_inputs, verified_strategy
from .counts import Counts

COUNT_LENGTH = 32  # T of BatchSizeCounts
# T of the paired speedup: the lab's 16..256, then on to where the saving shows its shrink on a 2-core
# machine (a step's attention work grows with T, the saving does not). 4096 would cost 15-20 s a commit.
RATIO_LENGTHS = [16, 64, 256, 1024, 2048]
TIMED_LENGTHS = LENGTHS[::2]  # T of BatchStrategy: 16, 64, 256


class BatchStrategy(Benchmark):
    """Full T-step decode of B = 2 sequences ``x: [2, T, 64]`` (both sequences in one timing).

    asv's own timing of each side, for the gate and the dashboard, at the lab's shortest, middle and
    longest T; the speedup and the per-step times come from BatchRatios' pairs.
    """

    params = [TIMED_LENGTHS, list(STRATEGIES["batch"])]
    param_names = ["T", "strategy"]

    def setup(self, T, strategy):
        self.decode = verified_strategy(strategy, T, BATCH)
        self.inputs = timed_inputs(T, BATCH)

    def time_decode(self, T, strategy):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): both sequences' full T-step decode of timed_inputs(T, 2), per strategy
    time_decode.version = "35da4ba066b844095cf42b91e92a485c42f958e7af5eba597af326416e3a2bef"

    def peakmem_decode(self, T, strategy):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): peak RSS of a process after that decode (its check's oracle included)
    peakmem_decode.version = "399a37d87e58616d89852053a83467415d54424d173f4a5e13a488640335febf"


class BatchSize(Benchmark):
    """Batched decode at T = 128 for B in {1, 2, 4, 8}: positions/s = B x 128 / time."""

    params = [SWEEP_BATCH_SIZES]
    param_names = ["B"]

    def setup(self, B):
        self.decode = verified_strategy("batched", SWEEP_LENGTH, B)
        self.inputs = timed_inputs(SWEEP_LENGTH, B)

    def time_batched_decode(self, B):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): the batched decode of timed_inputs(128, B)
    time_batched_decode.version = "891d42ca3c02f3595412aacc6e9a1a3996daf02aec134cf565af2c998689844b"


class BatchCounts(Counts):
    """Instructions and estimated cycles of the decode of B = 2 sequences ``x: [2, T, 64]``, per strategy."""

    params = [[32], list(STRATEGIES["batch"])]
    param_names = ["T", "strategy"]

    def prepare(self, T, strategy):
        return verified_strategy(strategy, T, BATCH), timed_inputs(T, BATCH)


class BatchSizeCounts(Counts):
    """Instructions and estimated cycles of the batched decode at T = 32 for B = 1 and 8, the ends of the sweep.

    A quarter of the sweep's T = 128, which cost 9 s under callgrind.
    """

    params = [[SWEEP_BATCH_SIZES[0], SWEEP_BATCH_SIZES[-1]]]
    param_names = ["B"]

    def prepare(self, B):
        return verified_strategy("batched", COUNT_LENGTH, B), timed_inputs(COUNT_LENGTH, B)
