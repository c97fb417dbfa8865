"""The roofline experiment's answer: one decode step at model shapes as a fraction of the read bandwidth
(benchmarks/bench_roofline.py: the step, its bytes, its oracle and the read kernel)."""

from benchmarks.bench_roofline import PARAM_NAMES, PARAMS, bandwidth_fraction, not_measured, read_kernel, verified_step
from benchmarks.ratios import Ratios


class Roofline(Ratios):
    """One decode step of B sequences against T cached positions, float32, as a fraction of the read bandwidth.

    shape: a key of ``MODEL_SHAPES`` (Llama-3-8B GQA 32/8/128, Llama-2-7B MHA
    32/32/128); T: positions in the cache; B: sequences; path: grouped or
    repeat_kv. ``track_ratio`` (and ``_low``, ``_high``: its 95 % interval) is the
    bandwidth fraction, the median of the per-pair read time / step time,
    measured with the rates in ``setup_cache``; points over the 2 GiB memory
    budget or the time budget (:func:`not_measured`) skip, saying why.
    """

    params = PARAMS
    param_names = PARAM_NAMES
    version = "2"  # of the fraction: the read kernel is np.vdot (read_kernel), no longer .sum()
    seconds = 0  # the fewest pairs: a pair of the largest points takes 0.3 s
    min_pairs = 6  # the fewest with a 95 % interval (the smallest and largest of 6: 96.9 %)
    timeout = 300

    def sides(self, *point):  # measured by measure() below: the two sides are not a ratio of two timings
        raise NotImplementedError

    def measure(self, shape, T, B, path):
        why = not_measured(shape, T, B, path)
        if why:
            raise NotImplementedError(why)
        step, cache = verified_step(shape, T, B, path)
        read, nbytes = read_kernel(shape, T, B, path, cache)
        return bandwidth_fraction(step, read, nbytes, self.seconds, self.min_pairs)

    def track_step_gbps(self, measured, *point):
        """The step's rate: its bytes over its median time, 10^9 bytes per second."""
        return self.tracked("step_gbps")

    track_step_gbps.unit = "GB/s"
    track_step_gbps.version = "1"

    def track_read_gbps(self, measured, *point):
        """The read kernel's rate over the same bytes, timed in turns with the step: the machine's bandwidth."""
        return self.tracked("read_gbps")

    track_read_gbps.unit = "GB/s"
    track_read_gbps.version = "2"
