"""Cache experiment: one sequence, no cache vs a concatenated cache vs a preallocated one."""

import inspect

from .common import Benchmark, D_K, D_V, LENGTHS, STRATEGIES, SkipNotImplemented, timed_inputs, verified_strategy
from .counts import Counts


class CacheStrategy(Benchmark):
    """Full T-step decode of one sequence ``x: [T, 64]``, float64, per strategy."""

    params = [LENGTHS, list(STRATEGIES["cache"])]
    param_names = ["T", "strategy"]

    def setup(self, T, strategy):
        self.decode = verified_strategy(strategy, T)
        self.inputs = timed_inputs(T)

    def time_decode(self, T, strategy):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): the full T-step decode of timed_inputs(T) [T, 64], per strategy
    time_decode.version = "3c37fe9c71a7cc9ebb27833f6c36452f56b398037d275a14d1c9bc0b858713a2"

    def peakmem_decode(self, T, strategy):
        self.decode(*self.inputs)

    # pinned asv hash (9108790): peak RSS of a process after that decode (its check's oracle included)
    peakmem_decode.version = "a3c142f7db9cd014d80d93fe796abe10ce38cd81c5b8d19b814ded9813e00513"

    def track_kv_cache_bytes(self, T, strategy):
        """Logical K/V bytes held after the decode: 2 x T x 64 x 8 for a float64 cache, 0 without one."""
        if strategy == "no_cache":
            return 0
        import kv_attention

        cache_class = {"concat": "DynamicCache", "preallocated": "StaticCache"}[strategy]
        if not hasattr(kv_attention, cache_class) or "cache" not in inspect.signature(self.decode).parameters:
            raise SkipNotImplemented(f"kv_attention has no {cache_class} or cache= at this commit")
        if strategy == "concat":
            cache = kv_attention.DynamicCache()
        else:
            cache = kv_attention.StaticCache((), T, D_K, D_V)
        self.decode(*self.inputs, cache=cache)
        return cache.nbytes

    track_kv_cache_bytes.unit = "bytes"
    # pinned asv hash (9108790): the cache's nbytes after that decode, 2 x T x 64 x 8 (0 for no_cache)
    track_kv_cache_bytes.version = "b59bea7c73594a61808a03b85d444da953a7d75d9367ab1541de0f62885b52f8"


class CacheCounts(Counts):
    """Instructions and estimated cycles of one full T-step decode of ``x: [T, 64]``, per strategy (callgrind)."""

    params = [[16, 32], list(STRATEGIES["cache"])]  # no_cache at T = 64 alone cost 10 s under callgrind
    param_names = ["T", "strategy"]

    def prepare(self, T, strategy):
        return verified_strategy(strategy, T), timed_inputs(T)
