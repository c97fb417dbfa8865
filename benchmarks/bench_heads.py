"""Heads experiment: MHA, GQA and MQA decode, repeating K/V per query head or attending on grouped views."""

import tracemalloc

from .counts import Counts
from .heads_inputs import HEADS_LENGTHS, HEADS_PATHS, KINDS, heads_inputs, verified_cache_bytes, verified_heads_decode


class HeadsDecode:
    """Full T-step decode of B = 4 sequences ``x: [4, T, 128]``, 8 query heads of D_head = 16, float64.

    kind: mha (8 K/V heads), gqa (2), mqa (1). path: repeat_kv copies K/V per
    query head at every step; grouped attends on the cache's own views.
    """

    params = [list(KINDS), HEADS_LENGTHS, HEADS_PATHS]
    param_names = ["kind", "T", "path"]
    rounds = 1  # one process per point: its correctness check (an oracle per head) costs more than a sample
    repeat = (2, 4, 0.3)  # 2 to 4 samples: a T = 1024 decode takes 0.1-0.7 s; HeadsCounts detects finely
    timeout = 300

    def setup(self, kind, T, path):
        self.decode = verified_heads_decode(kind, T, path)
        self.inputs = heads_inputs(kind, T)

    def time_decode(self, kind, T, path):
        self.decode(*self.inputs)

    time_decode.version = "44c2be19a9a17b049dc00d90a12e1745196ac6ba32aa2676436ce51227f54246"

    def track_decode_peak_bytes(self, kind, T, path):
        """Peak bytes allocated during one decode (tracemalloc, which sees numpy's allocations).

        The cache, 2 x 4 x H_kv x T x 16 x 8 bytes, the output [4, T, 128] and the
        per-step temporaries: repeat_kv's copies of K and V, [4, 8, t, 16] each,
        for gqa and mqa. Unlike ``peakmem_``, it excludes the correctness check's oracle run in setup.
        """
        tracemalloc.start()
        try:
            self.decode(*self.inputs)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    track_decode_peak_bytes.unit = "bytes"
    track_decode_peak_bytes.version = "138e91b6a7d3a7ec68828bbdb138afab2bdfc3e8fea1aadd117a30c6813e3119"


class HeadsCacheBytes:
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
    track_kv_cache_bytes.version = "27f1abfbb2b66e26af51c7bdb71b8024fcfb2079bd120139db2880029d6085ac"


class HeadsCounts(Counts):
    """Instructions and estimated cycles of the gqa decode of ``x: [4, 64, 128]`` (8 query heads, 2 K/V), per path."""

    params = [["gqa"], [64], HEADS_PATHS]
    param_names = ["kind", "T", "path"]

    def prepare(self, kind, T, path):
        return verified_heads_decode(kind, T, path), heads_inputs(kind, T)
