"""Every decode strategy equals the reference position by position, is causal, and refuses bad input.

Bad input raises a clear error naming the argument and shapes, and changes
nothing; hypothesis draws random shapes, lengths, batch sizes and scales.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv

from ..references import BATCHED, SINGLE, naive_causal_attention, problem, strategy_problem
from .helpers import run

LENGTHS = [1, 2, 3, 7, 16]


@pytest.mark.parametrize("t_len", LENGTHS)
def test_float64_matches_reference(strategy, t_len):
    args = strategy_problem(strategy, t_len)
    out = run(strategy, *args)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, kv.causal_attention(*args), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out, naive_causal_attention(*args), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("t_len", [1, 5, 13])
def test_float32_matches_float64_reference(strategy, t_len):
    args32 = strategy_problem(strategy, t_len, dtype=np.float32)
    out = run(strategy, *args32)
    assert out.dtype == np.float32
    expected = naive_causal_attention(*(a.astype(np.float64) for a in args32))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", SINGLE + BATCHED)  # the single-sequence strategies take [B, T, D_model] too
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_batch_axis_never_mixes_sequences(name, batch):
    args = problem(6, batch)
    out = run(name, *args)
    assert out.shape == (batch, 6, 5)
    for b in range(batch):
        np.testing.assert_allclose(
            out[b], naive_causal_attention(args[0][b], *args[1:]), rtol=1e-10, atol=1e-10
        )


@pytest.mark.parametrize("t_changed", [0, 3, 8])
def test_changing_x_t_changes_no_earlier_output(strategy, t_changed):
    args = strategy_problem(strategy, 9)
    x = args[0]
    before = run(strategy, *args)
    x2 = x.copy()
    x2[..., t_changed, :] += 10.0
    after = run(strategy, x2, *args[1:])
    # Steps before t_changed run the same computation on the same inputs: bit for bit, or they read x[t_changed].
    np.testing.assert_array_equal(after[..., :t_changed, :], before[..., :t_changed, :])
    assert not np.allclose(after[..., t_changed, :], before[..., t_changed, :])


@pytest.mark.parametrize(
    "name, make_cache",
    [("concat", kv.DynamicCache), ("preallocated", lambda: kv.StaticCache((), 11, 3, 5))],
)
def test_decode_continues_from_a_filled_cache(name, make_cache):
    # Decoding x[:4] then x[4:] into one cache equals decoding x at once.
    args = problem(11)
    cache = make_cache()
    first = run(name, args[0][:4], *args[1:], cache=cache)
    second = run(name, args[0][4:], *args[1:], cache=cache)
    assert cache.get_seq_length() == 11
    np.testing.assert_allclose(
        np.concatenate([first, second]), naive_causal_attention(*args), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize(
    "name, make_cache",
    [("concat", kv.DynamicCache), ("preallocated", lambda: kv.StaticCache((3,), 11, 3, 5))],
)
def test_a_batch_continues_from_a_filled_cache_of_its_leading_axes(name, make_cache):
    x, w_q, w_k, w_v = problem(11, 3)
    cache = make_cache()
    first = run(name, x[:, :4], w_q, w_k, w_v, cache=cache)
    second = run(name, x[:, 4:], w_q, w_k, w_v, cache=cache)
    assert cache.get_seq_length() == 11 and cache.k_cache.shape[0] == 3
    np.testing.assert_allclose(
        np.concatenate([first, second], axis=1), naive_causal_attention(x, w_q, w_k, w_v), rtol=1e-10, atol=1e-10
    )


def test_batched_decode_fills_a_b_by_t_cache():
    x, w_q, w_k, w_v = problem(6, 3)
    cache = kv.StaticCache((3,), 6, 3, 5)
    kv.batched_cached_attention(x, w_q, w_k, w_v, cache=cache)
    np.testing.assert_allclose(cache.k_cache, x @ w_k, rtol=1e-12)  # [B, T, D_k]
    np.testing.assert_allclose(cache.v_cache, x @ w_v, rtol=1e-12)  # [B, T, D_v]


# --- bad input ------------------------------------------------------------------------------------

ARG_NAMES = ("x", "w_q", "w_k", "w_v")


def test_x_with_wrong_number_of_axes(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 4)
    for wrong in (x[0], x[None]) if strategy in BATCHED else (x[0], x[None, None]):
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


def test_read_only_inputs_work_and_are_not_written(strategy):
    args = strategy_problem(strategy, 6)
    copies = [a.copy() for a in args]
    for a in args:
        a.flags.writeable = False
    run(strategy, *args)
    for a, original in zip(args, copies):
        np.testing.assert_array_equal(a, original)  # against a copy


def test_masked_and_ragged_inputs_are_refused(strategy):
    x, w_q, w_k, w_v = strategy_problem(strategy, 3)
    with pytest.raises(TypeError, match="x is a masked array"):
        run(strategy, np.ma.masked_array(x, mask=np.zeros_like(x, dtype=bool)), w_q, w_k, w_v)
    with pytest.raises(ValueError, match="w_q is not a rectangular array"):
        run(strategy, x, [[1.0, 2.0], [3.0]], w_k, w_v)


def test_big_endian_float64_is_float64(strategy):
    args = strategy_problem(strategy, 5)
    expected = run(strategy, *args)
    # '>f8' is converted to the same native values, then the same computation runs: bit for bit.
    np.testing.assert_array_equal(run(strategy, args[0].astype(">f8"), *args[1:]), expected)


def test_a_cache_too_short_for_t_is_refused_and_unchanged():
    x, w_q, w_k, w_v = strategy_problem("preallocated", 6)
    cache = kv.StaticCache((), 8, 3, 5)
    kv.cached_attention_preallocated(x[:3], w_q, w_k, w_v, cache=cache)
    k_before, v_before = cache.k_cache.copy(), cache.v_cache.copy()
    with pytest.raises(ValueError, match="cache too short: 3 of max_seq_len=8 positions used, x needs T=6"):
        kv.cached_attention_preallocated(x, w_q, w_k, w_v, cache=cache)  # needs 3 + 6 positions
    assert cache.get_seq_length() == 3
    np.testing.assert_array_equal(cache.k_cache, k_before)  # untouched buffers, against copies
    np.testing.assert_array_equal(cache.v_cache, v_before)


@pytest.mark.parametrize(
    "name, cache, error, message",
    [
        ("preallocated", kv.StaticCache((), 9, 2, 5), ValueError, "cache does not fit x"),  # D_k 2, not 3
        ("preallocated", kv.StaticCache((), 9, 3, 5, np.float32), TypeError, "float32"),
        ("batched", kv.StaticCache((2,), 9, 3, 5), ValueError, "cache does not fit x"),  # B = 2, x has 3
        ("concat", "not a cache", TypeError, "cache must be a kv_attention.Cache instance"),
        ("concat", kv.DynamicCache, TypeError, "cache must be a kv_attention.Cache instance"),
    ],
)
def test_a_cache_that_does_not_fit_is_refused(name, cache, error, message):
    with pytest.raises(error, match=message):
        run(name, *strategy_problem(name, 6), cache=cache)
    if isinstance(cache, kv.StaticCache):
        assert cache.get_seq_length() == 0 and (cache.k_cache is None or not cache.k_cache.any())  # None: no dtype yet


def test_a_cache_that_does_not_fit_is_refused_even_for_t_0():
    x, w_q, w_k, w_v = strategy_problem("preallocated", 0)
    with pytest.raises(ValueError, match="cache does not fit x"):
        kv.cached_attention_preallocated(x, w_q, w_k, w_v, cache=kv.StaticCache((), 4, 2, 5))


# --- properties (hypothesis) ---------------------------------------------------------------------


@st.composite
def problems(draw, batched):
    """(x, w_q, w_k, w_v) with independent widths and a random input scale."""
    t_len = draw(st.integers(1, 12))
    d_model, d_k, d_v = (draw(st.integers(1, 6)) for _ in range(3))
    scale = draw(st.floats(1e-3, 30.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (draw(st.integers(1, 4)), t_len, d_model) if batched else (t_len, d_model)
    x = rng.standard_normal(shape) * scale
    weights = (rng.standard_normal((d_model, d)) / np.sqrt(d_model) for d in (d_k, d_k, d_v))
    return (x, *weights)


@settings(max_examples=60, deadline=None)
@given(args=problems(batched=False), name=st.sampled_from(SINGLE))
def test_single_sequence_strategies_match_naive(args, name):
    np.testing.assert_allclose(run(name, *args), naive_causal_attention(*args), rtol=1e-10, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(args=problems(batched=True), name=st.sampled_from(BATCHED))
def test_batched_strategies_match_naive(args, name):
    np.testing.assert_allclose(run(name, *args), naive_causal_attention(*args), rtol=1e-10, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(args=problems(batched=False), name=st.sampled_from(SINGLE))
def test_each_output_is_a_convex_combination_of_past_values(args, name):
    # Softmax weights are >= 0 and sum to 1, so out[t] lies within the range of v[0..t].
    x, w_q, w_k, w_v = args
    out = run(name, *args)
    v = x @ w_v
    slack = 1e-9 * (1 + np.abs(v).max())
    assert (out >= np.minimum.accumulate(v, axis=0) - slack).all()
    assert (out <= np.maximum.accumulate(v, axis=0) + slack).all()


@settings(max_examples=40, deadline=None)
@given(args=problems(batched=True), cut=st.integers(0, 12))
def test_prefix_of_the_input_gives_the_prefix_of_the_output(args, cut):
    # Decoding x[:, :cut] reproduces the first cut positions of decoding all of x: steps 0..cut-1 run the
    # same computation on the same inputs (shapes included) either way, so bit for bit.
    x, w_q, w_k, w_v = args
    full = kv.batched_cached_attention(x, w_q, w_k, w_v)
    np.testing.assert_array_equal(kv.batched_cached_attention(x[:, :cut], w_q, w_k, w_v), full[:, :cut])
