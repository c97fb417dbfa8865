"""The suite's tracer of allocations and lines (benchmarks/bench_work.py) on functions whose allocations and lines are known."""

import numpy as np
import pytest

from benchmarks.bench_work import trace_decode

from .conftest import asv_listing


def allocate_and_free(n_arrays, n_bytes):
    """Allocates ``n_arrays`` buffers of ``n_bytes`` one after another, each freed at once."""
    for _ in range(n_arrays):
        buffer = np.ones(n_bytes, dtype=np.uint8)
        del buffer


def grow_by_concatenation(steps, width):
    """Copies 1, 2, ..., steps rows of ``width`` float64: sum = steps (steps + 1) / 2 rows."""
    rows = np.empty((0, width))
    for _ in range(steps):
        rows = np.concatenate([rows, np.ones((1, width))])


@pytest.mark.parametrize("n_arrays", [1, 5, 20])
def test_bytes_count_every_buffer_even_when_freed_within_its_line(n_arrays):
    n_bytes = 1 << 20  # 1 MiB: the interpreter's own few hundred bytes per line are far below it
    allocated, _ = trace_decode(allocate_and_free, (n_arrays, n_bytes))
    assert n_arrays * n_bytes <= allocated < n_arrays * n_bytes + 64 * 1024


def test_bytes_grow_quadratically_with_concatenation():
    width = 4096  # 32 KiB per row
    small, _ = trace_decode(grow_by_concatenation, (10, width))
    large, _ = trace_decode(grow_by_concatenation, (40, width))
    copied = lambda steps: steps * (steps + 1) // 2 * width * 8  # noqa: E731
    assert copied(10) <= small < 1.2 * copied(10) + 2 * 10 * width * 8
    assert copied(40) <= large < 1.2 * copied(40) + 2 * 40 * width * 8


def test_lines_count_the_lines_executed():
    def three_lines(x):
        y = x + 1
        z = y * 2
        return z

    def loop(n):
        total = 0
        for i in range(n):
            total += i
        return total

    assert trace_decode(three_lines, (1,))[1] == 3
    assert trace_decode(loop, (4,))[1] == 1 + (4 + 1) + 4 + 1  # the for line runs once more, to stop


def test_tracing_is_switched_off_afterwards():
    import sys
    import tracemalloc

    trace_decode(allocate_and_free, (1, 8))
    assert sys.gettrace() is None and not tracemalloc.is_tracing()


def test_each_class_counts_every_point_once_in_its_own_setup_cache(one_thread):
    from benchmarks import bench_work, common

    class SmallCacheWork(bench_work.CacheWork):
        params = [[4, 8], ["concat", "preallocated"]]

    counted = SmallCacheWork().setup_cache()
    assert set(counted) == {(t, s) for t in (4, 8) for s in ("concat", "preallocated")}
    decode, inputs = common.library_function("cached_attention"), common.timed_inputs(8)
    trace_decode(decode, inputs)
    allocated, lines = trace_decode(decode, inputs)
    assert counted[(8, "concat")]["value"][1] == lines  # exact; bytes within the interpreter's bookkeeping
    assert abs(counted[(8, "concat")]["value"][0] - allocated) < 4096
    bench = SmallCacheWork()
    bench.setup(counted, 8, "concat")
    assert bench.track_lines_per_step(counted, 8, "concat") == lines / 8
    # asv keys a setup_cache by where it is defined: each class has its own, so none is shared.
    key = {name: asv_listing()[f"bench_work.{name}.track_lines_per_step"]["setup_cache_key"] for name in ("CacheWork",
                                                                                                           "BatchWork")}
    assert key["CacheWork"] != key["BatchWork"]
