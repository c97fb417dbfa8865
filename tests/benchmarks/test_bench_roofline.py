"""Roofline: the fraction of the read bandwidth a step reaches, paired, measured in setup_cache and replayed."""

import functools

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import bench_roofline, pairs
from benchmarks import roofline_inputs as ri
from tests.benchmarks.test_roofline_inputs import tiny_shapes  # noqa: F401 (the fixture of MODEL_SHAPES)

uses_tiny_shapes = pytest.mark.usefixtures("tiny_shapes")


class SmallRoofline(bench_roofline.Roofline):
    params = [["Tiny-GQA"], [600], [1, 2], ri.ROOFLINE_PATHS]


def fixed_times(monkeypatch, seconds):
    """Sides whose every sample takes ``seconds[call]``: nothing is timed."""
    monkeypatch.setattr(pairs, "local_side", lambda call, number=1, clock=None: lambda n: [seconds[call]] * n)


def test_the_fraction_is_read_time_over_step_time_with_both_rates(monkeypatch):
    warm = []
    step, read = (lambda: warm.append("step")), (lambda: warm.append("read"))
    fixed_times(monkeypatch, {step: 0.04, read: 0.01})
    measured = bench_roofline.bandwidth_fraction(step, read, 2 * 10**8, seconds=0, min_pairs=7)
    assert warm == ["step", "read"]  # one warm-up call each, outside the timing
    assert measured["pairs"] == 7 and measured["burst"] == 1
    assert (measured["ratio"], measured["low"], measured["high"]) == pytest.approx((0.25, 0.25, 0.25))
    assert measured["step_gbps"] == pytest.approx(5.0) and measured["read_gbps"] == pytest.approx(20.0)


@uses_tiny_shapes
def test_the_read_kernel_sums_the_weights_the_cache_and_a_buffer_of_the_copies(one_thread):
    for path in ri.ROOFLINE_PATHS:
        _, cache = ri.verified_step("Tiny-GQA", 600, 2, path)
        read, nbytes = bench_roofline.read_kernel("Tiny-GQA", 600, 2, path, cache)
        sums = read()
        weights = ri.layer_weights("Tiny-GQA")
        assert [float(s) for s in sums[:6]] == [float(a.sum()) for a in (*weights, cache.k_cache, cache.v_cache)]
        copies = 2 * 2 * 4 * 601 * 8 * 4 if path == "repeat_kv" else 0  # K and V for 4 query heads, [2, 4, 601, 8]
        assert nbytes == sum(a.nbytes for a in weights) + 2 * cache.k_cache.nbytes + copies
        assert len(sums) == 6 + bool(copies) and (not copies or sums[6] == copies // 4)  # a buffer of ones


@uses_tiny_shapes
def test_setup_cache_measures_every_point_and_the_tracked_values_replay_it(one_thread, monkeypatch):
    monkeypatch.setattr(bench_roofline, "bandwidth_fraction",
                        lambda step, read, nbytes, seconds, min_pairs: {"ratio": 0.5, "low": 0.4, "high": 0.6,
                                                                        "pairs": min_pairs, "burst": 1,
                                                                        "bytes": nbytes, "step_gbps": 1.0,
                                                                        "read_gbps": 2.0})
    measured = SmallRoofline().setup_cache()
    assert set(measured) == {("Tiny-GQA", 600, b, p) for b in (1, 2) for p in ri.ROOFLINE_PATHS}
    point = ("Tiny-GQA", 600, 2, "repeat_kv")
    assert measured[point]["verified"] == ["roofline repeat_kv Tiny-GQA at T=600, B=2"]
    bench = SmallRoofline()
    bench.setup(measured, *point)
    assert [bench.track_ratio(measured, *point), bench.track_ratio_low(measured, *point),
            bench.track_ratio_high(measured, *point), bench.track_step_gbps(measured, *point),
            bench.track_read_gbps(measured, *point)] == [0.5, 0.4, 0.6, 1.0, 2.0]
    sized = bench_roofline.RooflineBytes()
    sized.setup(*point)
    assert sized.track_bytes_read(*point) == measured[point]["value"]["bytes"] == ri.step_bytes(*point)


@uses_tiny_shapes
def test_a_point_left_out_skips_saying_why_and_a_wrong_step_fails(one_thread, monkeypatch):
    monkeypatch.setattr(bench_roofline, "not_measured", lambda shape, t, b, path: "too large" if b == 2 else None)
    right = kv.multi_head_decode
    monkeypatch.setattr(kv, "multi_head_decode", functools.wraps(right)(
        lambda *a, path, **k: right(*a, path=path, **k) * (1.01 if path == "repeat_kv" else 1)))
    monkeypatch.setattr(bench_roofline, "bandwidth_fraction", lambda *a: {"ratio": 0.5})
    measured = SmallRoofline().setup_cache()
    with pytest.raises(NotImplementedError, match="too large"):
        SmallRoofline().setup(measured, "Tiny-GQA", 600, 2, "grouped")
    with pytest.raises(AssertionError, match="roofline repeat_kv Tiny-GQA at T=600, B=1"):
        SmallRoofline().setup(measured, "Tiny-GQA", 600, 1, "repeat_kv")
    assert measured[("Tiny-GQA", 600, 1, "grouped")]["value"] == {"ratio": 0.5}


def test_the_real_points_fit_in_two_gib_by_their_arrays():
    """Each measured point's largest moment: the weights, the cache and the fill's chunk, or for repeat_kv the
    cache, the step's copies and the read kernel's buffer of their size (array shapes, float32)."""
    for shape, (n_heads, n_kv_heads) in {"Llama-3-8B": (32, 8), "Llama-2-7B": (32, 32)}.items():
        weights = 4 * 4096 * 128 * (2 * n_heads + 2 * n_kv_heads)
        for t_len in ri.ROOFLINE_LENGTHS:
            for batch in ri.ROOFLINE_BATCHES:
                for path in ri.ROOFLINE_PATHS:
                    if ri.not_measured(shape, t_len, batch, path):
                        continue
                    cache = 2 * 4 * batch * n_kv_heads * (t_len + 1) * 128
                    copied = path == "repeat_kv" and n_heads > n_kv_heads
                    copies = 2 * 4 * batch * n_heads * (t_len + 1) * 128 if copied else 0
                    assert weights + cache + 2 * copies <= 2 * 2**30, (shape, t_len, batch, path)


def test_the_tracked_values_have_units_and_versions():
    for name, unit in (("track_step_gbps", "GB/s"), ("track_read_gbps", "GB/s")):
        method = getattr(bench_roofline.Roofline, name)
        assert method.unit == unit and method.version == "1"
    assert bench_roofline.RooflineBytes.track_bytes_read.unit == "bytes"
    assert np.dtype(np.float32).itemsize == ri.ITEMSIZE
