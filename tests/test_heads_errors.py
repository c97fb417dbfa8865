"""Bad input to the multi-head functions raises a clear error naming the numbers, and changes nothing."""

import numpy as np
import pytest
from conftest import HEADS_PATHS, heads_decode, heads_problem

import kv_attention as kv

ARG_NAMES = ("x", "w_q", "w_k", "w_v", "w_o")


@pytest.mark.parametrize(
    "n_heads, n_kv_heads, error, message",
    [
        (6, 4, ValueError, r"n_heads=6 is not divisible by n_kv_heads=4"),
        (2, 6, ValueError, r"n_heads=2 is not divisible by n_kv_heads=6"),
        (0, 2, ValueError, r"n_heads must be >= 1, got 0"),
        (6, 0, ValueError, r"n_kv_heads must be >= 1, got 0"),
        (6, -2, ValueError, r"n_kv_heads must be >= 1, got -2"),
        (6.0, 2, TypeError, r"n_heads must be an integer, got 6.0"),
        (6, True, TypeError, r"n_kv_heads must be an integer, got True"),
    ],
)
def test_bad_head_counts(heads_function, n_heads, n_kv_heads, error, message):
    with pytest.raises(error, match=message):
        heads_function(*heads_problem(4), n_heads=n_heads, n_kv_heads=n_kv_heads)


@pytest.mark.parametrize(
    "position, cut, message",
    [
        (1, np.s_[:, :-1], r"w_q has 17 columns, which is not n_heads=6 × head_dim .*w_q \(5, 17\)"),
        (2, np.s_[:, :-1], r"w_k has 5 columns but n_kv_heads × head_dim = 2 × 3 = 6 .*w_k \(5, 5\)"),
        (3, np.s_[:, :-3], r"w_v has 3 columns but n_kv_heads × head_dim = 2 × 3 = 6 .*w_v \(5, 3\)"),
        (4, np.s_[:-1], r"w_o has 17 rows but n_heads × head_dim = 6 × 3 = 18: w_o \(17, 4\)"),
        (1, np.s_[:-1], r"w_q has 4 rows but x has D_model=5: x \(3, 4, 5\), w_q \(4, 18\)"),
        (3, np.s_[:-1], r"w_v has 4 rows but x has D_model=5"),
    ],
)
def test_a_weight_that_is_not_heads_times_head_dim(heads_function, position, cut, message):
    args = list(heads_problem(4))
    args[position] = args[position][cut]
    with pytest.raises(ValueError, match=message):
        heads_function(*args)


def test_w_q_with_fewer_columns_than_heads(heads_function):
    x, w_q, w_k, w_v, w_o = heads_problem(4)
    with pytest.raises(ValueError, match=r"w_q has 4 columns, which is not n_heads=6 × head_dim"):
        heads_function(x, w_q[:, :4], w_k, w_v, w_o)


def test_wrong_number_of_axes(heads_function):
    x, w_q, w_k, w_v, w_o = heads_problem(4)
    with pytest.raises(ValueError, match=r"x must be \[T, D_model\] or \[B, T, D_model\], got shape \(1, 3, 4, 5\)"):
        heads_function(x[None], w_q, w_k, w_v, w_o)
    with pytest.raises(ValueError, match=r"w_o must be a matrix \[rows, columns\], got shape \(18, 4, 1\)"):
        heads_function(x, w_q, w_k, w_v, w_o[..., None])


@pytest.mark.parametrize("position", range(5))
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_names_the_argument(heads_function, position, bad):
    args = [a.copy() for a in heads_problem(4)]
    args[position][(0,) * args[position].ndim] = bad
    with pytest.raises(ValueError, match=rf"^{ARG_NAMES[position]} contains NaN or inf$"):
        heads_function(*args)


@pytest.mark.parametrize("position", range(5))
def test_non_float_dtype_is_a_type_error(heads_function, position):
    args = list(heads_problem(4))
    args[position] = args[position].astype(np.int64)
    with pytest.raises(TypeError, match=rf"{ARG_NAMES[position]} must be a float32 or float64 array"):
        heads_function(*args)


def test_inputs_too_large_for_the_dtype_raise(heads_function):
    x, *weights = heads_problem(4, dtype=np.float32)
    with pytest.raises(ValueError, match="too large for float32"):
        heads_function(x * np.float32(1e20), *weights)


@pytest.mark.parametrize("path", ["Grouped", "repeat", None, ["grouped"]])
def test_unknown_path(path):
    with pytest.raises(ValueError, match=r"unknown path .*; known: repeat_kv, grouped"):
        heads_decode(*heads_problem(4), path=path)


@pytest.mark.parametrize("batch", [None, 3])
def test_zero_length_returns_an_empty_array(heads_function, batch):
    out = heads_function(*heads_problem(0, batch))
    assert out.shape == ((0, 4) if batch is None else (3, 0, 4)) and out.dtype == np.float64


def test_read_only_inputs_work_and_are_not_written(heads_function):
    args = heads_problem(6)
    copies = [a.copy() for a in args]
    for a in args:
        a.flags.writeable = False
    heads_function(*args)
    for a, original in zip(args, copies):
        np.testing.assert_array_equal(a, original)


def _filled_cache(t_len=3, t_max=8):
    """A StaticCache (3, 2) holding the first t_len positions of heads_problem's x."""
    cache = kv.StaticCache((3, 2), t_max, 3, 3)
    heads_decode(*heads_problem(t_len), cache=cache)
    return cache


@pytest.mark.parametrize(
    "cache, error, message",
    [
        (kv.StaticCache((3, 3), 9, 3, 3), ValueError, r"k_cache \(3, 3, 9, 3\) .* must be \[3, 2, T_max, 3\]"),
        (kv.StaticCache((3, 2), 9, 2, 3), ValueError, r"cache does not fit x.*head_dim=3"),
        (kv.StaticCache((2, 2), 9, 3, 3), ValueError, r"cache does not fit x"),
        (kv.StaticCache((3,), 9, 3, 3), ValueError, r"cache does not fit x"),
        (kv.StaticCache((3, 2), 9, 3, 3, np.float32), TypeError, r"cache holds float32 but the computation is f"),
        (kv.StaticCache((3, 2), 5, 3, 3), ValueError, r"cache too short: 0 of max_seq_len=5 .* x needs T=6"),
        ("not a cache", TypeError, r"cache must be a cache instance"),
        (kv.StaticCache, TypeError, r"cache must be a cache instance"),
    ],
)
@pytest.mark.parametrize("path", HEADS_PATHS)
def test_a_cache_that_does_not_fit_is_refused_and_unchanged(path, cache, error, message):
    with pytest.raises(error, match=message):
        heads_decode(*heads_problem(6), path=path, cache=cache)
    if isinstance(cache, kv.StaticCache):
        assert cache.get_seq_length() == 0 and not cache.k_cache.any() and not cache.v_cache.any()


@pytest.mark.parametrize("path", HEADS_PATHS)
def test_a_failure_after_the_loop_leaves_a_filled_cache_as_it_was(path):
    # Finite heads times a huge w_o overflow only in the output projection, after
    # the new positions were written: the cache must be cropped back.
    cache = _filled_cache()
    k_before, v_before = cache.k_cache.copy(), cache.v_cache.copy()
    x, w_q, w_k, w_v, w_o = heads_problem(4)
    with pytest.raises(ValueError, match="attention overflowed float64"):
        heads_decode(x, w_q, w_k, w_v, np.full_like(w_o, 1e308), path=path, cache=cache)
    assert cache.get_seq_length() == 3
    np.testing.assert_array_equal(cache.k_cache, k_before)
    np.testing.assert_array_equal(cache.v_cache, v_before)


def test_bad_input_with_a_filled_cache_changes_nothing():
    cache = _filled_cache()
    k_before = cache.k_cache.copy()
    x, w_q, w_k, w_v, w_o = heads_problem(4)
    for bad in (dict(n_kv_heads=4), dict(path="paged")):
        with pytest.raises(ValueError):
            heads_decode(x, w_q, w_k, w_v, w_o, cache=cache, **bad)
    with pytest.raises(ValueError, match="cache too short: 3 of max_seq_len=8 positions used, x needs T=6"):
        heads_decode(*heads_problem(6), cache=cache)
    assert cache.get_seq_length() == 3
    np.testing.assert_array_equal(cache.k_cache, k_before)


def test_keys_already_in_a_cache_enter_the_overflow_check():
    cache = kv.StaticCache((3, 2), 8, 3, 3)
    cache.update(np.full((3, 2, 1, 3), 1e308), np.ones((3, 2, 1, 3)))
    with pytest.raises(ValueError, match="too large for float64"):
        heads_decode(*heads_problem(3), cache=cache)
    assert cache.get_seq_length() == 1
