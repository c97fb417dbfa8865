"""The lab's ratios, paired: the two sides of one question timed in turns, in one process, as tracked values.

asv times every point in processes of its own, at different moments, so the
ratio of two of its medians compares the machine's drift as much as the code
(the README's unpaired batch speedups read 1.151 / 2.161 / 1.376 / 1.579 /
1.361 for T = 16 ... 256). Here both sides of a ratio run in one process,
alternated burst by burst by :func:`pairs.pairs_within`, and the ratio stored
is the median of the per-pair ratios, with its distribution-free 95 % interval
(:func:`pairs.median_interval`).

An experiment's ratio points are a subclass of :class:`Ratios` in its bench
module, with asv's ``params`` and ``param_names`` and a ``sides`` method::

    class CacheRatios(Ratios):
        params = [LENGTHS, ["no_cache", "concat"]]
        param_names = ["T", "strategy"]

        def sides(self, T, strategy):
            return Side(verified_strategy(strategy, T), timed_inputs(T)), Side(...preallocated...)

``sides`` returns ``(numerator, denominator)`` (and optionally a constant
factor), each behind the experiment's own correctness check, so the commit's
NotImplementedError (the point skips) and AssertionError (it fails) are the
timings' own. Every point is measured ONCE per commit, in the class's own
``setup_cache`` (:class:`common.Measured`); ``setup`` replays it, and the
three tracked values read it:

- ``track_ratio``: the median of the per-pair ratios (unit "ratio");
- ``track_ratio_low`` and ``track_ratio_high``: its 95 % interval's ends.

Their ``version`` is the class's: a subclass whose ratio changes meaning sets
its own.

How long a point takes is sized by time: about ``seconds`` of pairs
(at least :data:`MIN_PAIRS`), ``burst`` samples of each side per pair (one
for a side whose single call fills a sample), each sample at least
:data:`SAMPLE_SECONDS` of calls (:func:`pairs.calibrate`). A sample is timed
in the thread's CPU time (:data:`CLOCK`): on a shared machine the time other
jobs hold the core is not the code's, and a sample it lands in would count it.
Garbage collection is off while the pairs run, as in asv's own timings.
"""

import abc
import gc
import math
import statistics
import time

from . import pairs
from .common import Measured, SkipNotImplemented

MIN_PAIRS = 9  # the fewest ratios whose 95 % interval is not [min, max]: [x_(2), x_(8)]
FEWEST_PAIRS = 6  # the fewest with a 95 % interval at all, [min, max] (97 %): for a side of seconds
MAX_PAIRS = 200
SAMPLE_SECONDS = 2e-3  # one sample is at least this many seconds of calls (pairs.calibrate's default)
CLOCK = time.thread_time  # CPU time of the benchmark's thread: not the time other jobs held the core


class Side:
    """One side of a ratio: ``call(*inputs, **options)``, then ``after()`` (inside the timing, e.g. a cache's crop)."""

    def __init__(self, call, inputs, after=None, **options):
        self.call, self.inputs, self.after, self.options = call, inputs, after, options

    def __call__(self):
        self.call(*self.inputs, **self.options)
        if self.after is not None:
            self.after()


def paired_ratio(numerator, denominator, seconds, burst=pairs.BURST, factor=1.0, min_pairs=MIN_PAIRS):
    """``{"ratio", "low", "high", "pairs", "burst", "numerator_seconds", "denominator_seconds"}``: ``factor`` x
    time(numerator) / time(denominator), paired; the seconds lists hold each side's value (seconds a call) in
    every pair, in order, so ``numerator_seconds[i] / denominator_seconds[i]`` is the i-th per-pair ratio.

    Each side is calibrated to samples of at least SAMPLE_SECONDS of calls,
    timed by CLOCK; then :func:`pairs.pairs_within` alternates them for about
    ``seconds`` (at least ``min_pairs`` pairs), ``burst`` samples of each per pair,
    or one where a single call of a side fills a sample (a slow side); the
    ratio is the median of the per-pair ratios and low, high its 95 % interval.
    """
    numbers = [pairs.calibrate(side, SAMPLE_SECONDS) for side in (denominator, numerator)]
    seconds_of = {"denominator_seconds": [], "numerator_seconds": []}  # each side's value in each pair
    first, second = (_kept(pairs.local_side(side, n, CLOCK), seconds_of[name])
                     for side, n, name in zip((denominator, numerator), numbers, seconds_of))
    burst = 1 if min(numbers) == 1 else burst
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        ratios = pairs.pairs_within(first, second, seconds, min_pairs, MAX_PAIRS, burst)
    finally:
        if enabled:
            gc.enable()
    median, low, high = pairs.median_interval(ratios)
    return {"ratio": factor * median, "low": factor * low, "high": factor * high, "pairs": len(ratios),
            "burst": burst, **seconds_of}


def _kept(samples, kept):
    """``samples`` that also appends the median of each burst to ``kept``: the side's value in that pair."""

    def kept_samples(n):
        out = samples(n)
        kept.append(statistics.median(out))
        return out

    return kept_samples


class Ratios(Measured, abc.ABC):
    """A paired ratio per parameter combination, measured once per commit (see the module docstring)."""

    version = "1"  # of the three ratios, the class's unless a subclass's ratio changes meaning
    seconds = 0.25  # of pairs per point, about (pairs_within sizes them by wall time)
    burst = pairs.BURST  # samples of each side per pair, where no single call fills a sample
    min_pairs = MIN_PAIRS
    # timeout: Benchmark's 120 s, also setup_cache's, where every point of the class is measured

    @abc.abstractmethod  # abstract: asv collects no class of it where a bench module imports it
    def sides(self, *point):
        """``(numerator, denominator)`` or ``(numerator, denominator, factor)``: zero-argument callables, checked."""

    def measure(self, *point):
        numerator, denominator, *factor = self.sides(*point)
        return paired_ratio(numerator, denominator, self.seconds, self.burst, *factor, min_pairs=self.min_pairs)

    def tracked(self, key):
        value = self.measured[key]
        if not math.isfinite(value):  # fewer than 6 ratios: no 95 % interval (never with MIN_PAIRS)
            raise SkipNotImplemented(f"no 95 % interval from {self.measured['pairs']} ratios")
        return value

    def track_ratio(self, measured, *point):
        """The median of the per-pair ratios: numerator over denominator, timed in turns."""
        return self.tracked("ratio")

    track_ratio.unit = "ratio"

    def track_ratio_low(self, measured, *point):
        """The lower end of the median's distribution-free 95 % interval."""
        return self.tracked("low")

    track_ratio_low.unit = "ratio"

    def track_ratio_high(self, measured, *point):
        """The upper end of the median's distribution-free 95 % interval."""
        return self.tracked("high")

    track_ratio_high.unit = "ratio"
