"""Heads experiment: MHA, GQA and MQA decode, repeating K/V per query head or attending on grouped views."""

import tracemalloc

from .common import Benchmark, check_points, replay
from .counts import Counts
from .ratios import Ratios, Side
from .heads_inputs import HEADS_LENGTHS, HEADS_PATHS, KINDS, heads_inputs, verified_cache_bytes, verified_heads_decode


class PeakBytes:
    """Peak bytes allocated by one call of a decode (tracemalloc, which sees numpy's allocations)."""

    def __init__(self):
        self.peak = None

    def observe(self, decode):
        """``decode``, recording in ``.peak`` what its call allocated at the peak."""
        def traced(*inputs):
            tracemalloc.start()
            try:
                out = decode(*inputs)
                self.peak = tracemalloc.get_traced_memory()[1]
                return out
            finally:
                tracemalloc.stop()

        return traced


def check_and_trace(kind, T, path):
    """The point's correctness check with its decode traced: that decode's peak bytes."""
    peak = PeakBytes()
    decode = verified_heads_decode(kind, T, path, observe=peak.observe)
    if peak.peak is None:  # checked before in this process: trace a decode of its own
        peak.observe(decode)(*heads_inputs(kind, T))
    return peak.peak


class HeadsDecode(Benchmark):
    """Full T-step decode of B = 4 sequences ``x: [4, T, 128]``, 8 query heads of D_head = 16, float64.

    kind: mha (8 K/V heads), gqa (2), mqa (1). path: repeat_kv copies K/V per
    query head at every step; grouped attends on the cache's own views.

    Every point is checked once, in ``setup_cache`` (an oracle per head costs
    up to 2 s at T = 1024, more than a sample), its checked decode traced for
    the peak bytes; ``setup`` replays the outcome.
    """

    params = [list(KINDS), HEADS_LENGTHS, HEADS_PATHS]
    param_names = ["kind", "T", "path"]
    rounds = 1
    repeat = (2, 4, 0.3)  # 2 to 4 samples: a T = 1024 decode takes 0.3-1.8 s; HeadsCounts detects finely
    number = 1  # one decode per sample, and no warm-up: at T = 1024 a decode is its own calibration
    warmup_time = 0
    timeout = 300

    def setup_cache(self):
        return check_points(self.params, check_and_trace)

    def setup(self, checked, kind, T, path):
        self.peak_bytes = replay(checked, (kind, T, path))
        self.decode = verified_heads_decode(kind, T, path)  # verified in setup_cache: not run again
        self.inputs = heads_inputs(kind, T)

    def time_decode(self, checked, kind, T, path):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): the full T-step multi_head_decode of heads_inputs(kind, T) [4, T, 128], per path
    time_decode.version = "44c2be19a9a17b049dc00d90a12e1745196ac6ba32aa2676436ce51227f54246"

    def track_decode_peak_bytes(self, checked, kind, T, path):
        """Peak bytes allocated during one decode (tracemalloc, which sees numpy's allocations).

        The cache, 2 x 4 x H_kv x T x 16 x 8 bytes, the output [4, T, 128] and the
        per-step temporaries: repeat_kv's copies of K and V, [4, 8, t, 16] each,
        for gqa and mqa. Unlike ``peakmem_``, it excludes the check's oracle: the
        check's own decode, in ``setup_cache``, is the one traced.
        """
        return self.peak_bytes

    track_decode_peak_bytes.unit = "bytes"
    # pinned asv hash (9108790): tracemalloc's peak over the check's own decode
    track_decode_peak_bytes.version = "138e91b6a7d3a7ec68828bbdb138afab2bdfc3e8fea1aadd117a30c6813e3119"


class HeadsCacheBytes(Benchmark):
    """Logical K/V cache bytes of the timed problem by ``kv_cache_bytes``: one layer, B = 4, D_head = 16, float64.

    The numbers behind the decode's peak bytes: 2 x 4 x H_kv x T x 16 x 8.
    """

    params = [list(KINDS), HEADS_LENGTHS]
    param_names = ["kind", "T"]

    def setup(self, kind, T):
        self.nbytes = verified_cache_bytes(kind, T)

    def track_kv_cache_bytes(self, kind, T):
        return self.nbytes

    track_kv_cache_bytes.unit = "bytes"
    # pinned asv hash (9108790): kv_cache_bytes of one layer, 2 x 4 x H_kv x T x 16 x 8
    track_kv_cache_bytes.version = "27f1abfbb2b66e26af51c7bdb71b8024fcfb2079bd120139db2880029d6085ac"


class HeadsCounts(Counts):
    """Instructions and estimated cycles of the gqa decode of ``x: [4, 32, 128]`` (8 query heads, 2 K/V), per path."""

    params = [["gqa"], [32], HEADS_PATHS]
    param_names = ["kind", "T", "path"]

    def prepare(self, kind, T, path):
        return verified_heads_decode(kind, T, path), heads_inputs(kind, T)


RATIO_LENGTH = 64  # T of HeadsRatios: a pair at T = 1024 (0.3-1.8 s per decode) would cost seconds


class HeadsRatios(Ratios):
    """repeat_kv / grouped per kind at T = 64: HeadsDecode's two paths timed in turns, paired.

    What copying K/V per query head at every step costs over attending on the
    cache's grouped views. At HeadsDecode's shortest T: its T = 1024 would cost
    seconds per pair, beyond the suite's budget.
    """

    params = [list(KINDS), [RATIO_LENGTH]]
    param_names = ["kind", "T"]

    def setup_cache(self):
        return self.measure_points()

    def sides(self, kind, T):
        return (Side(verified_heads_decode(kind, T, "repeat_kv"), heads_inputs(kind, T)),
                Side(verified_heads_decode(kind, T, "grouped"), heads_inputs(kind, T)))
