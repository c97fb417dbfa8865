"""The prefill benchmarks: the banded oracle, the checks of chunked attention and cache bytes, skips, and the cache-bytes classes checked once in setup_cache."""

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import bench_prefill, common

from ..references import naive_causal_attention


def test_cache_bytes_are_the_positions_held_times_128_float64s(one_thread):
    nbytes = bench_prefill.ChunkedCacheBytes().setup_cache()
    for chunk_size in bench_prefill.CHUNK_SIZES:
        bench = bench_prefill.ChunkedCacheBytes()
        bench.setup(nbytes, chunk_size)
        assert bench.track_kv_cache_bytes(nbytes, chunk_size) == 512 * (64 + 64) * 8


@pytest.mark.parametrize("bench, missing, point", [
    (bench_prefill.ChunkedCacheBytes, "chunked_attention", (16,)),
    (bench_prefill.WindowCacheBytes, "SlidingWindowCache", ("64", 256)),
])
def test_a_commit_without_the_function_skips_every_point_instead_of_failing(one_thread, monkeypatch, bench,
                                                                           missing, point):
    monkeypatch.delattr(kv, missing)
    nbytes = bench().setup_cache()
    with pytest.raises(NotImplementedError, match=f"no {missing}"):  # in setup, where asv takes it for a skip
        bench().setup(nbytes, *point)


@pytest.mark.parametrize("window, n_sink", [(None, 0), (1, 0), (3, 0), (3, 2), (20, 4)])
def test_banded_oracle_matches_the_independent_reference(window, n_sink):
    inputs = common.timed_inputs(13)
    np.testing.assert_allclose(bench_prefill.banded_oracle(*inputs, window=window, n_sink=n_sink),
                               naive_causal_attention(*inputs, window=window, n_sink=n_sink), rtol=1e-10, atol=1e-10)


def test_the_issues_sizes():
    assert bench_prefill.PREFILL_LENGTH == 512 and bench_prefill.CHUNK_SIZES == [1, 16, 64, 512]
    assert bench_prefill.WINDOW_LENGTH == 1024
    assert bench_prefill.WINDOWS == {"64": (64, 0), "256": (256, 0), "256+4sinks": (256, 4), "none": (None, 0)}


@pytest.mark.parametrize("chunk_size, window, n_sink", [(1, None, 0), (5, None, 0), (1, 4, 0), (7, 4, 2)])
def test_check_passes_chunked_attention(one_thread, chunk_size, window, n_sink):
    prefill = bench_prefill.verified_chunked(32, chunk_size, window, n_sink)
    assert prefill.func is kv.chunked_attention
    assert prefill.keywords == {"chunk_size": chunk_size, "window": window, "n_sink": n_sink, "check_finite": False}


def test_check_fails_a_window_off_by_one(one_thread, monkeypatch):
    # window W + 1 keys instead of W: the bug of counting the window without the current key
    def wrong(x, w_q, w_k, w_v, *, chunk_size, window, n_sink, cache=None):
        return bench_prefill.banded_oracle(x, w_q, w_k, w_v, window=window + 1, n_sink=n_sink)

    monkeypatch.setattr(kv, "chunked_attention", wrong)
    with pytest.raises(AssertionError, match="chunk_size=1, window=4, n_sink=0 at T=32"):
        bench_prefill.verified_chunked(32, 1, 4)


@pytest.mark.parametrize("t_len, window, n_sink, positions", [(40, None, 0, 40), (40, 8, 0, 8), (40, 8, 2, 10),
                                                                (6, 8, 2, 6)])
def test_cache_bytes_are_checked(one_thread, t_len, window, n_sink, positions):
    assert bench_prefill.held_cache_bytes(t_len, 3, window, n_sink) == positions * 128 * 8


def test_cache_bytes_that_are_wrong_fail(one_thread, monkeypatch):
    monkeypatch.setattr(kv.SlidingWindowCache, "nbytes", property(lambda self: 0))
    with pytest.raises(AssertionError, match="cache bytes after chunk_size=1, window=8, n_sink=0 at T=40: 0"):
        bench_prefill.held_cache_bytes(40, 1, 8)


def test_checks_skip_what_the_commit_lacks(one_thread, monkeypatch):
    monkeypatch.delattr(kv, "chunked_attention")
    with pytest.raises(NotImplementedError, match="no chunked_attention"):
        bench_prefill.verified_chunked(32, 1)
    monkeypatch.undo()
    monkeypatch.setattr(common, "VERIFIED", set())
    monkeypatch.delattr(kv, "SlidingWindowCache")
    with pytest.raises(NotImplementedError, match="no SlidingWindowCache"):
        bench_prefill.held_cache_bytes(32, 1, 8)
