"""The paired ratios (benchmarks/ratios.py): measured once per commit, replayed, each side behind its check."""

import gc
import importlib
import inspect
import itertools
import math
import statistics
import time

import pytest

from benchmarks import common, pairs, ratios
from benchmarks.common import SkipNotImplemented

from .conftest import asv_listing

BENCH_MODULES = ["bench_cache", "bench_batch", "bench_heads", "bench_ragged", "bench_prefill", "bench_split"]


def ratio_classes():
    classes = []
    for name in BENCH_MODULES:
        module = importlib.import_module(f"answers.{name}")
        classes += [c for _, c in inspect.getmembers(module, inspect.isclass)
                    if c.__module__ == module.__name__ and issubclass(c, ratios.Ratios)]
    return classes


def fake_clock(monkeypatch, costs, drift=0.01, calls=None):
    """Sides whose samples are their ``costs[side]`` on a machine that slows by ``drift`` per sample: no timing.

    ``calls``: side -> the calls per sample calibrate finds (1: a single call fills a sample).
    """
    ticks = iter(range(10**6))
    clocks = []

    def local_side(call, number=1, clock=None):
        clocks.append(clock)
        return lambda n: [costs[call] * (1 + drift * next(ticks)) for _ in range(n)]

    monkeypatch.setattr(pairs, "local_side", local_side)
    monkeypatch.setattr(pairs, "calibrate", lambda call, sample_seconds=2e-3: (calls or {}).get(call, 1))
    return clocks


def test_a_paired_ratio_is_the_median_of_per_pair_ratios_times_the_factor(monkeypatch):
    clocks = fake_clock(monkeypatch, {"num": 3.0, "den": 2.0}, calls={"num": 2, "den": 5})
    seen = []
    real = pairs.pairs_within

    def pairs_within(first, second, seconds, min_pairs, max_pairs, burst):
        seen.append((gc.isenabled(), seconds, min_pairs, burst))
        out = real(first, second, seconds, min_pairs, max_pairs, burst)
        seen.append(out)
        return out

    monkeypatch.setattr(pairs, "pairs_within", pairs_within)
    measured = ratios.paired_ratio("num", "den", 0.0, burst=3, factor=4.0)
    (gc_on, seconds, min_pairs, burst), per_pair = seen
    assert (gc_on, seconds, min_pairs, burst) == (False, 0.0, ratios.MIN_PAIRS, 3) and gc.isenabled()
    assert clocks == [time.thread_time] * 2  # CPU time: not the time other jobs held the core
    assert measured["pairs"] == len(per_pair) == ratios.MIN_PAIRS  # 0 s: the fewest pairs
    # Each pair's value is the median of its burst: its middle sample, 1 tick after the burst's first.
    assert all(r == pytest.approx(1.5, rel=0.1) for r in per_pair)
    ordered = sorted(per_pair)
    assert measured["ratio"] == pytest.approx(4 * statistics.median(per_pair))
    assert (measured["low"], measured["high"]) == pytest.approx((4 * ordered[1], 4 * ordered[7]))  # n = 9: 2nd, 8th


def test_a_side_whose_one_call_fills_a_sample_is_paired_one_sample_at_a_time(monkeypatch):
    fake_clock(monkeypatch, {"num": 3.0, "den": 2.0}, calls={"num": 1, "den": 40})
    assert ratios.paired_ratio("num", "den", 0.0, burst=3)["burst"] == 1


class Tiny(ratios.Ratios):
    """Three points: one measured, one the commit lacks, one wrong."""

    params = [["ok", "absent", "wrong"]]
    param_names = ["case"]
    seconds = 0  # the fewest pairs

    def sides(self, case):
        if case == "absent":
            raise NotImplementedError("no such function at this commit")
        if case == "wrong":
            raise AssertionError("differs from the oracle")
        return "num", "den", 2.0


def test_every_point_is_measured_once_in_setup_cache_and_replayed_by_the_three_tracked_values(monkeypatch):
    fake_clock(monkeypatch, {"num": 3.0, "den": 1.0}, drift=0.0)
    measured = Tiny().setup_cache()
    assert measured[("ok",)]["value"] == {"ratio": 6.0, "low": 6.0, "high": 6.0, "pairs": ratios.MIN_PAIRS, "burst": 1,
                                           "numerator_seconds": [3.0] * ratios.MIN_PAIRS,
                                           "denominator_seconds": [1.0] * ratios.MIN_PAIRS}
    bench = Tiny()
    bench.setup(measured, "ok")
    monkeypatch.setattr(pairs, "local_side", None)  # replayed: nothing is timed again
    assert [bench.track_ratio(measured, "ok"), bench.track_ratio_low(measured, "ok"),
            bench.track_ratio_high(measured, "ok")] == [6.0, 6.0, 6.0]
    with pytest.raises(NotImplementedError, match="no such function"):  # in setup: asv skips the point
        Tiny().setup(measured, "absent")
    with pytest.raises(AssertionError, match="differs from the oracle"):  # asv fails it
        Tiny().setup(measured, "wrong")


def test_a_tracked_value_without_an_interval_skips():
    bench = Tiny()
    bench.measured = {"ratio": 1.5, "low": -math.inf, "high": math.inf, "pairs": 5}
    assert bench.track_ratio(None, "ok") == 1.5
    with pytest.raises(SkipNotImplemented, match="from 5 ratios"):
        bench.track_ratio_low(None, "ok")


def test_the_tracked_values_are_ratios_with_the_class_version():
    for name in ("track_ratio", "track_ratio_low", "track_ratio_high"):
        assert getattr(ratios.Ratios, name).unit == "ratio" and not hasattr(getattr(ratios.Ratios, name), "version")
        assert asv_listing("answers")[f"bench_ragged.RaggedRatios.{name}"]["version"] == "3"  # its class's
        assert asv_listing("answers")[f"bench_cache.CacheRatios.{name}"]["version"] == ratios.Ratios.version == "1"


def test_each_ratio_class_has_its_own_setup_cache_and_every_question_is_asked():
    """asv shares a setup_cache by where it is defined: an inherited one would measure one class for all."""
    classes = ratio_classes()
    assert {c.__name__ for c in classes} == {"CacheRatios", "BatchRatios", "BatchSizeRatios", "HeadsRatios",
                                             "RaggedRatios", "PagedStepRatios", "PrefillRatios", "SplitRatios",
                                             "CascadeRatios"}
    keys = {asv_listing("answers")[f"{c.__module__.split('.')[-1]}.{c.__name__}.track_ratio"]["setup_cache_key"]
            for c in classes}
    assert len(keys) == len(classes)  # e.g. bench_split's two classes: two keys


POINTS = {  # class -> one cheap point, and the keys its two sides' checks add to VERIFIED
    "CacheRatios": ((16, "concat"), {"concat at T=16, B=None", "preallocated at T=16, B=None"}),
    "BatchRatios": ((16,), {"sequential at T=16, B=2", "batched at T=16, B=2"}),
    "BatchSizeRatios": ((2,), {"batched at T=128, B=1", "batched at T=128, B=2"}),
    "HeadsRatios": (("gqa", 64), {"repeat_kv gqa at T=64", "grouped gqa at T=64"}),
    "RaggedRatios": (("padded", "skewed"), {"padded, skewed", "paged, skewed"}),
    "PagedStepRatios": (("gather_2048",), set()),  # checked once a process by paged_step_sides (lru_cache)
    "PrefillRatios": ((16,), {"chunked_attention chunk_size=16, window=None, n_sink=0 at T=512",
                              "chunked_attention chunk_size=512, window=None, n_sink=0 at T=512"}),
    "SplitRatios": ((4,), {"multi_head_decode, num_splits=4, last 16 of T=2048",
                           "multi_head_decode, num_splits=None, last 16 of T=2048"}),
    "CascadeRatios": ((), {"cascade, B=8, prefix 1024, suffixes 64", "concatenated, B=8, prefix 1024, suffixes 64"}),
}


@pytest.mark.parametrize("name", sorted(POINTS))
def test_both_sides_pass_the_experiments_own_check_before_anything_is_timed(name, one_thread):
    cls = next(c for c in ratio_classes() if c.__name__ == name)
    point, keys = POINTS[name]
    assert point in set(itertools.product(*cls.params))
    numerator, denominator, *factor = cls().sides(*point)
    assert common.VERIFIED == keys
    numerator(), denominator()  # callable with no arguments, as pairs.local_side times them
    if name == "BatchSizeRatios":
        assert factor == [2.0]  # positions / s at B over B = 1 = B x time(B = 1) / time(B)


def test_a_wrong_side_fails_its_point_and_a_missing_one_skips_it(one_thread, monkeypatch):
    import kv_attention

    from answers.bench_cache import CacheRatios

    right = kv_attention.decode_without_cache
    monkeypatch.setattr(kv_attention, "cached_attention", lambda *a, **k: right(*a) + 1e-3)
    monkeypatch.delattr(kv_attention, "decode_without_cache")
    bench = CacheRatios()
    bench.params = [[16], ["no_cache", "concat"]]
    measured = bench.setup_cache()
    assert "skipped" in measured[(16, "no_cache")] and "AssertionError" in measured[(16, "concat")]["failed"]


def test_the_batch_per_step_times_come_from_the_speedups_own_pairs():
    from answers.bench_batch import BatchRatios

    seq = [3.0, 5.0, 4.0, 6.0, 4.5, 3.5, 5.5, 4.0, 5.0]  # seconds of each side's decode, pair by pair
    bat = [2.0, 2.5, 3.0, 2.0, 2.5, 3.5, 2.0, 3.0, 2.5]
    bench, t_len = BatchRatios(), 10
    bench.measured = {"numerator_seconds": seq, "denominator_seconds": bat}
    saved = sorted((s - b) / t_len for s, b in zip(seq, bat))  # 0, 0.1, 0.1, 0.1, 0.2, 0.25, 0.25, 0.35, 0.4
    assert bench.track_sequential_step(None, t_len) == 4.5 / t_len
    assert bench.track_batched_step(None, t_len) == 2.5 / t_len
    assert bench.track_saved_step(None, t_len) == saved[4] == 0.2
    assert (bench.track_saved_step_low(None, t_len), bench.track_saved_step_high(None, t_len)) == (saved[1], saved[7])
