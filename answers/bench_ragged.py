"""The ragged experiment's answers: padded and compacted over paged decode, and one paged step, paired."""

from benchmarks.bench_ragged import PAGED_STEP, paged_step_sides, ragged_inputs, verified_ragged_decode
from benchmarks.common import STRATEGIES
from benchmarks.ratios import Ratios, Side


class RaggedRatios(Ratios):
    """padded / paged and compacted / paged of the skewed batch: RaggedDecode's decodes timed in turns, paired.
    Not for ``equal``, where no sequence ends early (its pairs cost about 5 s a commit), nor ``uniform``, which
    asks nothing the skewed and equal batches do not (RaggedDecode still times both)."""

    params = [[s for s in STRATEGIES["ragged"] if s != "paged"], ["skewed"]]
    param_names = ["strategy", "lengths"]
    # 2: paged, the denominator, attends block by block through the block tables, no longer gathering (issue 31);
    # 3: paged reads each stored token once, one attention per length (issue 39)
    version = "3"

    def sides(self, strategy, lengths):
        return (Side(verified_ragged_decode(strategy, lengths), ragged_inputs(lengths)),
                Side(verified_ragged_decode("paged", lengths), ragged_inputs(lengths)))


class PagedStepRatios(Ratios):
    """One decode step of 1 sequence at T and 7 at 64 (block 16, D 64, float32), paired: ``gather_2048``, a minimal
    per-sequence gather-then-attend / paged at T = 2,048 (paging reads each stored token once: at least 0.8,
    within 1.25x of it), and ``padded_8192``, masked_attend over the batch padded to T / paged at T = 8,192
    (at least 2). They replace RaggedRatios' uniform points."""

    params = [list(PAGED_STEP)]
    param_names = ["point"]

    def sides(self, point):
        other, t_long = PAGED_STEP[point]
        steps = paged_step_sides(t_long)
        return Side(steps[other], ()), Side(steps["paged"], ())
