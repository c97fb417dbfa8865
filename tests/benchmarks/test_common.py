"""The asv suite's own machinery: its oracle, its correctness check, and skips for what a commit lacks."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import kv_attention as kv
from benchmarks import common

from ..references import naive_causal_attention


@pytest.mark.parametrize("batch", [None, 3])
def test_oracle_matches_the_independent_reference(batch):
    inputs = common.timed_inputs(9, batch)
    np.testing.assert_allclose(common.oracle(*inputs), naive_causal_attention(*inputs), rtol=1e-10, atol=1e-10)


def test_timed_inputs_are_the_labs_problem_and_read_only():
    x, w_q, w_k, w_v = common.timed_inputs(16, 2)
    assert x.shape == (2, 16, 64) and w_v.shape == (64, 64) and x.dtype == np.float64
    assert not any(a.flags.writeable for a in (x, w_q, w_k, w_v))
    np.testing.assert_array_equal(x, np.random.default_rng(42).standard_normal((2, 16, 64)))


@pytest.mark.parametrize("name", sorted(common.PUBLIC_FUNCTIONS))
def test_check_passes_every_correct_strategy(one_thread, name):
    batch = 2 if name in ("sequential", "batched") else None
    decode = common.verified_strategy(name, 16, batch)  # the mechanism: the commit's function, its scans off
    assert decode.func is getattr(kv, common.PUBLIC_FUNCTIONS[name]) and decode.keywords == {"check_finite": False}


def test_check_fails_a_strategy_that_is_0_1_percent_off(one_thread, monkeypatch):
    monkeypatch.setattr(kv, "cached_attention", lambda *args: 1.001 * kv.causal_attention(*args))
    with pytest.raises(AssertionError, match="concat at T=32"):
        common.verified_strategy("concat", 32)


def test_check_skips_a_strategy_the_commit_lacks(one_thread, monkeypatch):
    monkeypatch.delattr(kv, "batched_cached_attention")
    with pytest.raises(NotImplementedError, match="no batched_cached_attention"):
        common.verified_strategy("batched", 16, 2)


def test_check_fails_when_blas_runs_more_than_one_thread():
    with threadpool_limits(limits=2):
        if all(pool["num_threads"] == 1 for pool in threadpool_info()):
            pytest.skip("this machine's BLAS runs one thread only")
        with pytest.raises(AssertionError, match="not pinned to one thread"):
            common.check_single_threaded()


def test_check_points_records_each_outcome_and_replay_gives_it_to_setup(one_thread, monkeypatch):
    # A setup_cache checks every point once; setup() in another process replays the outcome.
    def check(t_len, strategy):
        if strategy == "missing":
            raise NotImplementedError("no such strategy at this commit")
        common.verified_strategy(strategy, t_len)
        return 10 * t_len

    monkeypatch.setitem(common.PUBLIC_FUNCTIONS, "wrong", "decode_without_cache")
    monkeypatch.setattr(kv, "decode_without_cache", lambda *a: kv.cached_attention(*a) * 1.001, raising=True)
    outcomes = common.check_points([[4, 8], ["preallocated", "missing", "wrong"]], check)
    assert outcomes[(4, "preallocated")] == {"value": 40, "verified": ["preallocated at T=4, B=None"]}
    assert outcomes[(8, "missing")] == {"skipped": "no such strategy at this commit"}
    assert outcomes[(8, "wrong")]["failed"].startswith("AssertionError: \nNot equal to tolerance")
    assert "wrong at T=8, B=None" in outcomes[(8, "wrong")]["failed"]

    common.VERIFIED.clear()  # as in a fresh benchmark process
    assert common.replay(outcomes, [8, "preallocated"]) == 80
    assert common.VERIFIED == {"preallocated at T=8, B=None"}
    with pytest.raises(NotImplementedError, match="no such strategy"):
        common.replay(outcomes, (4, "missing"))
    with pytest.raises(AssertionError, match="wrong at T=4"):
        common.replay(outcomes, (4, "wrong"))
    with pytest.raises(AssertionError, match=r"\(16, 'preallocated'\) was not checked"):
        common.replay(outcomes, (16, "preallocated"))
