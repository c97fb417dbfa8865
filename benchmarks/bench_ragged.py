"""Ragged experiment: 8 sequences of different lengths, padded vs compacted (dynamic exit) vs paged KV cache."""

from .ragged_inputs import LENGTH_DISTRIBUTIONS, RAGGED_STRATEGIES, ragged_gate, ragged_inputs, ragged_stats


class RaggedDecode:
    """Full decode of 8 sequences ``x_b: [T_b, 64]``, float64, block_size 16, a pool for the whole batch."""

    params = [RAGGED_STRATEGIES, list(LENGTH_DISTRIBUTIONS)]
    param_names = ["strategy", "lengths"]
    repeat = (10, 40, 1.0)
    timeout = 120

    def setup(self, strategy, lengths):
        self.decode = ragged_gate(strategy, lengths)
        self.inputs = ragged_inputs(lengths)

    def time_decode(self, strategy, lengths):
        self.decode(*self.inputs)

    def track_reserved_slots(self, strategy, lengths):
        """K/V token slots reserved at the peak: B x T_max for padded and compacted, peak blocks x 16 for paged."""
        return ragged_stats(self.decode, self.inputs).peak_reserved_slots

    track_reserved_slots.unit = "token slots"

    def track_row_steps(self, strategy, lengths):
        """Query rows computed over the decode: B x T_max for padded, the sum of T_b for compacted and paged."""
        return ragged_stats(self.decode, self.inputs).row_steps

    track_row_steps.unit = "row-steps"
