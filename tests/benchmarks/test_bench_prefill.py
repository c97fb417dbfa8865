"""The prefill cache-bytes classes: every point checked once in setup_cache, skipped where the commit lacks it."""

import pytest

import kv_attention as kv
from benchmarks import bench_prefill


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
