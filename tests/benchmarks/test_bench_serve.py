"""The serving benchmark's workload, oracle, correctness check, skips and reported counts."""

import math

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import bench_serve
from benchmarks.bench_serve import Serve, ServeCounts
from benchmarks.common import check_points

from ..references import serve_reference


@pytest.fixture
def one_thread(one_thread, monkeypatch):
    """conftest's one_thread, and a serving check that remembers no earlier run either."""
    bench_serve.verified_serve.cache_clear()
    yield
    bench_serve.verified_serve.cache_clear()


def test_the_workload_is_the_issues():
    specs, embedding, *weights = bench_serve.workload()
    assert len(specs) == 32 and embedding.shape == (512, 64) and all(w.shape == (64, 64) for w in weights)
    system = specs[0][0][:64]
    for i, (token_ids, prompt_len, arrival) in enumerate(specs):
        assert token_ids[:64] == system  # the shared 64-token system prompt
        assert 16 <= prompt_len - 64 <= 64 and 16 <= len(token_ids) - prompt_len <= 64
        assert arrival == i // 2 and all(0 <= t < 512 for t in token_ids)
    assert len({s[0][64:] for s in specs}) == 32  # the user prompts differ
    assert not any(a.flags.writeable for a in (embedding, *weights))
    assert bench_serve.POOLS["ample"] == sum(math.ceil(len(s[0]) / 16) for s in specs)


def test_the_oracle_matches_the_independent_reference():
    specs, *arrays = bench_serve.workload()
    shortest = min(specs, key=lambda s: len(s[0]))
    (got,) = bench_serve.serve_oracle([shortest], *arrays)
    np.testing.assert_allclose(got, serve_reference(shortest[0], shortest[1], *arrays), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pool", list(bench_serve.POOLS))
@pytest.mark.parametrize("caching", list(bench_serve.CACHING))
def test_the_check_passes_and_the_counts_show_what_each_point_is_for(one_thread, caching, pool):
    bench = Serve()
    bench.setup(caching, pool)
    assert bench.serve.func is kv.serve and bench.serve.keywords["enable_prefix_caching"] == (caching == "on")
    counts = ServeCounts()
    cache = check_points([[caching], [pool]], bench_serve.serve_counts)  # setup_cache's value, for this point
    counts.setup(cache, caching, pool)
    steps, preemptions, recomputed, hits, peak = (getattr(counts, f"track_{n}")(cache, caching, pool) for n in
                                                  bench_serve.COUNTS)
    assert (preemptions > 0 and recomputed > 0) == (pool == "tight")
    assert (hits > 0) == (caching == "on")
    assert peak <= bench_serve.POOLS[pool] and steps >= 16 + 16  # the last arrival is at step 15


def test_the_check_fails_a_serve_0_1_percent_off_in_one_request(one_thread, monkeypatch):
    real = kv.serve

    def wrong(*args, **kwargs):
        result = real(*args, **kwargs)
        result.outputs[7][-1] *= 1.001
        return result

    monkeypatch.setattr(kv, "serve", wrong)
    with pytest.raises(AssertionError, match="serve, prefix caching off, ample pool, sequence 7"):
        bench_serve.verified_serve("off", "ample")


def test_the_check_skips_what_the_commit_lacks(one_thread, monkeypatch):
    monkeypatch.delattr(kv, "Request")
    with pytest.raises(NotImplementedError, match="no Request"):
        bench_serve.verified_serve("on", "tight")
    monkeypatch.delattr(kv, "serve")
    with pytest.raises(NotImplementedError, match="no serve"):
        bench_serve.verified_serve("on", "tight")
    cache = ServeCounts().setup_cache()  # every point's outcome is kept; each point's setup raises its own
    for point in (("off", "ample"), ("on", "tight")):
        with pytest.raises(NotImplementedError, match="no serve"):
            ServeCounts().setup(cache, *point)


def test_a_wrong_serve_fails_its_counts_too(one_thread, monkeypatch):
    class NoOutputs:
        outputs, stats = {}, None

    monkeypatch.setattr(kv, "serve", lambda *args, **kwargs: NoOutputs())
    cache = check_points([["on"], ["ample"]], bench_serve.serve_counts)
    with pytest.raises(AssertionError, match="serve, prefix caching on, ample pool"):
        ServeCounts().setup(cache, "on", "ample")
