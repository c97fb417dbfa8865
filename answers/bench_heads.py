"""The heads experiment's answer: what copying K/V per query head costs over grouped views, paired."""

from benchmarks.bench_heads import KINDS, RATIO_LENGTH, heads_inputs, verified_heads_decode
from benchmarks.ratios import Ratios, Side


class HeadsRatios(Ratios):
    """repeat_kv / grouped per kind at T = 64: HeadsDecode's two paths timed in turns, paired.

    What copying K/V per query head at every step costs over attending on the
    cache's grouped views. At HeadsDecode's shortest T: its T = 1024 would cost
    seconds per pair, beyond the suite's budget.
    """

    params = [list(KINDS), [RATIO_LENGTH]]
    param_names = ["kind", "T"]

    def sides(self, kind, T):
        return (Side(verified_heads_decode(kind, T, "repeat_kv"), heads_inputs(kind, T)),
                Side(verified_heads_decode(kind, T, "grouped"), heads_inputs(kind, T)))
