"""check_finite in the suite: the mechanism timed without the scans where the commit has the keyword, and their cost."""

import numpy as np
import pytest

import kv_attention as kv
from answers import bench_checks
from benchmarks import common

from ..references import naive_attend


def with_check_finite(real, calls):
    """``real`` with the keyword the library is getting, recording each call's value of it in ``calls``."""

    def function(*args, check_finite=True, **kwargs):
        calls.append(check_finite)
        return real(*args, **kwargs)

    return function


def test_without_the_keyword_the_commits_function_is_timed_as_it_is(monkeypatch):
    def attend(q, k, v):  # a commit from before the keyword
        return kv.attention.attend(q, k, v)

    monkeypatch.setattr(kv, "attend", attend)
    assert common.library_function("attend") is attend
    assert common.library_function("attend", check_finite=True) is attend
    assert common.library_function("StaticCache") is kv.StaticCache  # a class is never bound


def test_a_table_of_the_library_is_read_as_it_is():
    assert common.library_function("MODEL_SHAPES") is kv.MODEL_SHAPES  # a dict: never bound, never hashed


def test_with_the_keyword_the_suite_turns_the_scans_off_unless_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(kv, "cached_attention", with_check_finite(kv.cached_attention, calls))
    x, w_q, w_k, w_v = common.timed_inputs(16)
    common.library_function("cached_attention")(x, w_q, w_k, w_v)
    common.library_function("cached_attention", check_finite=True)(x, w_q, w_k, w_v)
    assert calls == [False, True]


def test_the_attend_oracle_matches_the_independent_reference():
    q, k, v = bench_checks.attend_inputs()
    assert q.shape == (1, 1, 8) and k.shape == v.shape == (1, 4, 8)
    np.testing.assert_allclose(bench_checks.attend_oracle(q, k, v), naive_attend(q, k, v), rtol=1e-12, atol=1e-12)


def test_every_point_skips_at_a_commit_without_the_keyword(one_thread, monkeypatch):
    for name, *_ in bench_checks.CALLS.values():
        real = getattr(kv, name)
        monkeypatch.setattr(kv, name, lambda *args, real=real: real(*args))  # as before the keyword
    measured = bench_checks.CheckFiniteRatios().setup_cache()
    for call in bench_checks.CALLS:
        with pytest.raises(NotImplementedError, match="has no check_finite"):
            bench_checks.CheckFiniteRatios().setup(measured, call)


def test_the_numerator_is_the_default_call_and_the_denominator_the_unchecked_one(one_thread, monkeypatch):
    calls = []
    monkeypatch.setattr(kv, "attend", with_check_finite(kv.attend, calls))
    numerator, denominator = bench_checks.CheckFiniteRatios().sides("attend")
    assert calls == [True, False]  # each side's correctness check
    numerator()
    denominator()
    assert calls == [True, False, True, False]


def test_a_wrong_call_fails_its_point(one_thread, monkeypatch):
    real = kv.attend

    def wrong(q, k, v, *, check_finite=True):
        return real(q, k, v) * (1.001 if not check_finite else 1.0)

    monkeypatch.setattr(kv, "attend", wrong)
    measured = bench_checks.CheckFiniteRatios().setup_cache()
    with pytest.raises(AssertionError, match="attend, check_finite=False"):
        bench_checks.CheckFiniteRatios().setup(measured, "attend")


def test_at_a_commit_with_the_keyword_each_point_is_a_ratio_inside_its_interval(one_thread):
    if not all(common.takes_check_finite(getattr(kv, name)) for name, *_ in bench_checks.CALLS.values()):
        pytest.skip("this commit has no check_finite")
    measured = bench_checks.CheckFiniteRatios().setup_cache()
    for call in bench_checks.CALLS:
        bench = bench_checks.CheckFiniteRatios()
        bench.setup(measured, call)
        low, ratio, high = (getattr(bench, f"track_{n}")(measured, call) for n in ("ratio_low", "ratio", "ratio_high"))
        assert 0 < low <= ratio <= high and bench.measured["pairs"] >= 9
