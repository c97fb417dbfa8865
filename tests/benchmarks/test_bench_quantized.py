"""bench_quantized: every class measures or times its points behind the check, and skips where the commit lacks it."""

import math

import numpy as np
import pytest

import kv_attention as kv
from answers import bench_quantized as answer
from benchmarks import bench_quantized as bench
from benchmarks.common import timed_inputs


@pytest.fixture
def one_point(monkeypatch):
    """Each class at T = 64, int4 and float8_e5m2 only (the suite's grid takes seconds)."""
    for cls in (bench.QuantizedDecode, bench.QuantizedAccuracy, answer.QuantizedRatios, answer.FusedRatios):
        monkeypatch.setattr(cls, "params", [[64], ["int4", "float8_e5m2"]])


def measured_by(cls):
    """What asv hands a point of ``cls``: its setup_cache's result, if it has one."""
    return (cls().setup_cache(),) if hasattr(cls, "setup_cache") else ()


def test_every_class_gives_its_values_behind_the_check(one_thread, one_point):
    for cls in (bench.QuantizedDecode, bench.QuantizedAccuracy, answer.QuantizedRatios, answer.FusedRatios):
        measured = measured_by(cls)
        for kind in ("int4", "float8_e5m2"):
            point = cls()
            point.setup(*measured, 64, kind)
            for name in [n for n in dir(cls) if n.startswith(("time_", "track_"))]:
                value = getattr(point, name)(*measured, 64, kind)
                assert value is None if name.startswith("time_") else math.isfinite(value)


def test_bytes_per_position_and_the_error_are_the_caches_own(one_thread, one_point):
    measured = bench.QuantizedAccuracy().setup_cache()
    point = bench.QuantizedAccuracy()
    point.setup(measured, 64, "int4")
    x, w_q, w_k, w_v = timed_inputs(64)
    cache = kv.QuantizedCache((), 64, 64, nbits=4, group_size=32, residual_length=32)
    out = kv.cached_attention(x, w_q, w_k, w_v, cache=cache)
    # 32 positions of 4-bit codes (32 bytes each for K and V), a scale and a zero per channel of the one K block,
    # two per V position (64 channels in runs of 32), float64, and 32 exact positions of 128 float64s
    assert point.track_bytes_per_position(measured, 64, "int4") == cache.nbytes / 64 == (
        32 * 64 + 2 * 64 * 8 + 32 * 2 * 2 * 8 + 32 * 128 * 8) / 64
    exact = kv.causal_attention(x, w_q, w_k, w_v)
    assert point.track_max_abs_error(measured, 64, "int4") == pytest.approx(float(np.abs(out - exact).max()),
                                                                            rel=1e-9)


def test_a_commit_without_quantized_cache_skips_every_point(one_thread, one_point, monkeypatch):
    monkeypatch.delattr(kv, "QuantizedCache")
    for cls in (bench.QuantizedDecode, bench.QuantizedAccuracy, answer.QuantizedRatios, answer.FusedRatios):
        measured = measured_by(cls)
        with pytest.raises(NotImplementedError, match="no QuantizedCache"):
            cls().setup(*measured, 64, "int4")
    with pytest.raises(NotImplementedError, match="no QuantizedCache"):
        bench.QuantizedCounts().prepare("int4", "fused")
