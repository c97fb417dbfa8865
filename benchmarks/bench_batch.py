"""Batch experiment: B sequences decoded one after another vs together, and a batch-size sweep."""

from .common import BATCH, LENGTHS, SWEEP_BATCH_SIZES, SWEEP_LENGTH, gate, timed_inputs


class BatchStrategy:
    """Full T-step decode of B = 2 sequences ``x: [2, T, 64]`` (both sequences in one timing)."""

    params = [LENGTHS, ["sequential", "batched"]]
    param_names = ["T", "strategy"]
    rounds = 4
    repeat = (5, 20, 0.5)
    warmup_time = 0.05
    timeout = 120

    def setup(self, T, strategy):
        self.decode = gate(strategy, T, BATCH)
        self.inputs = timed_inputs(T, BATCH)

    def time_decode(self, T, strategy):
        self.decode(*self.inputs)

    def peakmem_decode(self, T, strategy):
        self.decode(*self.inputs)


class BatchSize:
    """Batched decode at T = 128 for B in {1, 2, 4, 8}: positions/s = B x 128 / time."""

    params = [SWEEP_BATCH_SIZES]
    param_names = ["B"]
    rounds = 4
    repeat = (5, 20, 0.5)
    warmup_time = 0.05
    timeout = 120

    def setup(self, B):
        self.decode = gate("batched", SWEEP_LENGTH, B)
        self.inputs = timed_inputs(SWEEP_LENGTH, B)

    def time_batched_decode(self, B):
        self.decode(*self.inputs)
