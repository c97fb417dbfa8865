"""Bad input raises a clear error naming the argument and shapes, and changes nothing."""

import numpy as np
import pytest
from conftest import BATCHED, run, strategy_problem

import kv_attention as kv

ARG_NAMES = ("x", "w_q", "w_k", "w_v")


def test_x_with_wrong_number_of_axes(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 4)
    wrong = x[0] if strategy in BATCHED else x[None]
    with pytest.raises(ValueError, match=r"x must be \[.*got shape"):
        run(strategy, wrong, w_q, w_k, w_v)


@pytest.mark.parametrize("position", [1, 2, 3])
def test_weight_rows_must_match_d_model(strategy, position):
    args = list(strategy_problem(strategy, 4))
    args[position] = args[position][:-1]  # D_model - 1 rows
    with pytest.raises(ValueError, match=rf"{ARG_NAMES[position]} has 3 rows but x has D_model=4"):
        run(strategy, *args)


def test_d_k_of_w_q_and_w_k_must_agree(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 4)
    with pytest.raises(ValueError, match=r"w_q and w_k must share D_k: w_q \(4, 3\), w_k \(4, 2\)"):
        run(strategy, x, w_q, w_k[:, :2], w_v)


def test_weights_must_be_matrices(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 4)
    with pytest.raises(ValueError, match=r"w_v must be \[D_model, D\], got shape \(4, 5, 1\)"):
        run(strategy, x, w_q, w_k, w_v[..., None])


@pytest.mark.parametrize("position", range(4))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_names_the_argument(strategy, position, bad):
    args = [a.copy() for a in strategy_problem(strategy, 4)]
    args[position][(0,) * args[position].ndim] = bad
    with pytest.raises(ValueError, match=rf"^{ARG_NAMES[position]} contains NaN or inf$"):
        run(strategy, *args)


@pytest.mark.parametrize("position", range(4))
@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.complex128, np.float16])
def test_non_float_dtype_is_a_type_error(strategy, position, dtype):
    args = list(strategy_problem(strategy, 4))
    args[position] = args[position].astype(dtype)
    with pytest.raises(TypeError, match=rf"{ARG_NAMES[position]} must be a float32 or float64 array"):
        run(strategy, *args)


def test_zero_length_returns_an_empty_array(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 0)
    out = run(strategy, x, w_q, w_k, w_v)
    assert out.shape == x.shape[:-1] + (5,) and out.dtype == np.float64


def test_reference_zero_length():
    x = np.zeros((2, 0, 4))
    assert kv.causal_attention(x, np.ones((4, 3)), np.ones((4, 3)), np.ones((4, 5))).shape == (2, 0, 5)


def test_read_only_inputs_work_and_are_not_written(strategy):
    args = strategy_problem(strategy, 6)
    copies = [a.copy() for a in args]
    for a in args:
        a.flags.writeable = False
    run(strategy, *args)
    for a, original in zip(args, copies):
        np.testing.assert_array_equal(a, original)


def test_inputs_too_large_for_the_dtype_raise_instead_of_returning_nan(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 4, dtype=np.float32)
    with pytest.raises(ValueError, match="too large for float32"):
        run(strategy, x * np.float32(1e20), w_q, w_k, w_v)


@pytest.mark.parametrize("name", ["no_cache", "concat", "preallocated"])
def test_a_score_that_would_overflow_to_minus_inf_raises(name):
    # q1·k0 = -c·c' + ... : a partial sum can overflow to -inf, which softmax would
    # silently treat as a masked position (weight 0). The true scaled score is finite.
    c = 1e308
    x = np.eye(2)
    w_q = np.array([[0.0] * 5, [1.0] * 5])
    w_k = np.array([[-c, -c, c, c, c], [0.0] * 5])
    with pytest.raises(ValueError, match="too large for float64"):
        run(name, x, w_q, w_k, np.eye(2))
    with pytest.raises(ValueError, match="too large for float64"):
        kv.causal_attention(x, w_q, w_k, np.eye(2))


def test_keys_already_in_a_cache_enter_the_overflow_check():
    x, w_q, w_k, w_v = strategy_problem("preallocated", 3)
    cache = kv.StaticCache((), 8, 3, 5)
    cache.update(np.full((1, 3), 1e308), np.ones((1, 5)))
    with pytest.raises(ValueError, match="too large for float64"):
        kv.cached_attention_preallocated(x, w_q, w_k, w_v, cache=cache)
    assert cache.get_seq_length() == 1


def test_masked_and_ragged_inputs_are_refused(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 3)
    with pytest.raises(TypeError, match="x is a masked array"):
        run(strategy, np.ma.masked_array(x, mask=np.zeros_like(x, dtype=bool)), w_q, w_k, w_v)
    with pytest.raises(ValueError, match="w_q is not a rectangular array"):
        run(strategy, x, [[1.0, 2.0], [3.0]], w_k, w_v)


def test_big_endian_float64_is_float64(strategy):
    args = strategy_problem(strategy, 5)
    expected = run(strategy, *args)
    np.testing.assert_array_equal(run(strategy, args[0].astype(">f8"), *args[1:]), expected)


def test_a_cache_too_short_for_t_is_refused_and_unchanged():
    x, w_q, w_k, w_v = strategy_problem("preallocated", 6)
    cache = kv.StaticCache((), 8, 3, 5)
    kv.cached_attention_preallocated(x[:3], w_q, w_k, w_v, cache=cache)
    k_before, v_before = cache.k_cache.copy(), cache.v_cache.copy()
    with pytest.raises(ValueError, match="cache too short: 3 of max_seq_len=8 positions used, x needs T=6"):
        kv.cached_attention_preallocated(x, w_q, w_k, w_v, cache=cache)  # needs 3 + 6 positions
    assert cache.get_seq_length() == 3
    np.testing.assert_array_equal(cache.k_cache, k_before)
    np.testing.assert_array_equal(cache.v_cache, v_before)


@pytest.mark.parametrize(
    "name, cache, error, message",
    [
        ("preallocated", kv.StaticCache((), 9, 2, 5), ValueError, "cache does not fit x"),  # D_k 2, not 3
        ("preallocated", kv.StaticCache((), 9, 3, 5, np.float32), TypeError, "float32"),
        ("batched", kv.StaticCache((2,), 9, 3, 5), ValueError, "cache does not fit x"),  # B = 2, x has 3
        ("concat", "not a cache", TypeError, "cache must be a cache instance"),
        ("concat", kv.DynamicCache, TypeError, "cache must be a cache instance"),
    ],
)
def test_a_cache_that_does_not_fit_is_refused(name, cache, error, message):
    with pytest.raises(error, match=message):
        run(name, *strategy_problem(name, 6), cache=cache)
    if isinstance(cache, kv.StaticCache):
        assert cache.get_seq_length() == 0 and not cache.k_cache.any()


def test_a_cache_that_does_not_fit_is_refused_even_for_t_0():
    x, w_q, w_k, w_v = strategy_problem("preallocated", 0)
    with pytest.raises(ValueError, match="cache does not fit x"):
        kv.cached_attention_preallocated(x, w_q, w_k, w_v, cache=kv.StaticCache((), 4, 2, 5))


def test_a_failed_call_leaves_a_new_dynamic_cache_new():
    x, w_q, w_k, w_v = strategy_problem("concat", 4, dtype=np.float32)
    cache = kv.DynamicCache()
    cache.update = lambda k, v, _update=cache.update: _update(k, v) if cache.get_seq_length() < 2 else 1 / 0
    with pytest.raises(ZeroDivisionError):
        kv.cached_attention(x, w_q, w_k, w_v, cache=cache)
    assert cache.k_cache is None and cache.get_seq_length() == 0


def test_problem_factory_checks_its_arguments():
    with pytest.raises(ValueError, match="seq_len must be >= 0"):
        kv.make_problem(-1)
    with pytest.raises(ValueError, match="d_k must be >= 1"):
        kv.make_problem(4, d_k=0)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        kv.make_problem(4, batch_size=2.5)
    with pytest.raises(TypeError, match="float32 or float64"):
        kv.make_problem(4, dtype=np.int32)
