"""causal_attention, the reference, against an independent loop-by-loop computation."""

import numpy as np
import pytest

import kv_attention as kv
from kv_attention.attention import band_mask

from ..references import naive_causal_attention, problem


@pytest.mark.parametrize("t_len", [1, 2, 5, 11])
def test_single_sequence_matches_naive(t_len):
    args = problem(t_len)
    out = kv.causal_attention(*args)
    assert out.shape == (t_len, 5)
    np.testing.assert_allclose(out, naive_causal_attention(*args), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("batch", [1, 4])
def test_batch_matches_naive_per_sequence(batch):
    args = problem(7, batch)
    out = kv.causal_attention(*args)
    assert out.shape == (batch, 7, 5)
    np.testing.assert_allclose(out, naive_causal_attention(*args), rtol=1e-10, atol=1e-10)


def test_first_position_is_its_own_value():
    # Position 0 attends only to itself, so its output is exactly v_0 = x_0 w_v.
    x, w_q, w_k, w_v = problem(6)
    np.testing.assert_allclose(kv.causal_attention(x, w_q, w_k, w_v)[0], x[0] @ w_v, rtol=1e-12)


def test_equal_keys_give_the_running_mean_of_values():
    # With w_k = 0 all scores are 0, so position t outputs the mean of v_0..v_t.
    x, w_q, w_k, w_v = problem(9)
    out = kv.causal_attention(x, w_q, np.zeros_like(w_k), w_v)
    v = x @ w_v
    running_mean = np.cumsum(v, axis=0) / np.arange(1, 10)[:, None]
    np.testing.assert_allclose(out, running_mean, rtol=1e-12, atol=1e-12)


def test_large_scores_stay_finite():
    # Scores of order 1e5 would overflow exp() without subtracting the row maximum.
    x, w_q, w_k, w_v = problem(8)
    x = x * 300.0
    out = kv.causal_attention(x, w_q, w_k, w_v)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, naive_causal_attention(x, w_q, w_k, w_v), rtol=1e-9, atol=1e-9)


def test_float32_inputs_compute_in_float32():
    args = problem(6, dtype=np.float32)
    out = kv.causal_attention(*args)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, naive_causal_attention(*args), rtol=1e-4, atol=1e-4)


def test_mixed_dtypes_promote_to_float64():
    x, w_q, w_k, w_v = problem(4, dtype=np.float32)
    assert kv.causal_attention(x, w_q, w_k, w_v.astype(np.float64)).dtype == np.float64


def test_reference_zero_length():
    x = np.zeros((2, 0, 4))
    assert kv.causal_attention(x, np.ones((4, 3)), np.ones((4, 3)), np.ones((4, 5))).shape == (2, 0, 5)


# The banded reference: sliding windows and attention sinks


@pytest.mark.parametrize("t_len", [1, 6, 9])
@pytest.mark.parametrize("window_of", [lambda t: 1, lambda t: 2, lambda t: t - 1, lambda t: t, lambda t: t + 3],
                         ids=["1", "2", "T-1", "T", "T+3"])
@pytest.mark.parametrize("n_sink", [0, 1, 3])
def test_banded_reference_matches_naive(t_len, window_of, n_sink):
    window = max(window_of(t_len), 1)
    args = problem(t_len)
    out = kv.causal_attention(*args, window=window, n_sink=n_sink)
    assert out.shape == (t_len, 5)
    expected = naive_causal_attention(*args, window=window, n_sink=n_sink)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10)


def test_banded_reference_batched_keeps_sequences_apart():
    args = problem(8, batch=3)
    out = kv.causal_attention(*args, window=3, n_sink=2)
    assert out.shape == (3, 8, 5)
    np.testing.assert_allclose(out, naive_causal_attention(*args, window=3, n_sink=2), rtol=1e-10, atol=1e-10)


def test_window_of_one_attends_only_to_itself():
    x, w_q, w_k, w_v = problem(7)
    np.testing.assert_allclose(kv.causal_attention(x, w_q, w_k, w_v, window=1), x @ w_v, rtol=1e-12, atol=1e-12)


def test_equal_keys_give_the_mean_of_the_window_and_the_sinks():
    # w_k = 0: every allowed key scores 0, so position t outputs the mean of the values it may attend to.
    x, w_q, w_k, w_v = problem(9)
    v = x @ w_v
    out = kv.causal_attention(x, w_q, np.zeros_like(w_k), w_v, window=3, n_sink=2)
    for t in range(9):
        allowed = sorted({0, 1} & set(range(t + 1)) | set(range(max(t - 2, 0), t + 1)))  # sinks 0, 1; window t-2..t
        np.testing.assert_allclose(out[t], v[allowed].mean(axis=0), rtol=1e-12, atol=1e-12)


def test_band_mask_by_hand():
    # T = 5, window 2, one sink: t attends t-1, t, and position 0.
    expected = np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [1, 0, 0, 1, 1],
    ], dtype=bool)
    positions = np.arange(5)
    np.testing.assert_array_equal(band_mask(positions, positions, window=2, n_sink=1), expected)
    # a chunk of queries 3, 4 after three cached positions: the causal diagonal is offset, not square
    np.testing.assert_array_equal(band_mask(np.array([3, 4]), positions, window=2, n_sink=1), expected[3:])


@pytest.mark.parametrize("t_len", [1, 6])
def test_no_window_and_a_window_past_t_are_exactly_the_causal_reference(t_len):
    # n_sink without a window changes nothing, and a window >= T masks nothing more than causality: bit for bit.
    args = problem(t_len, batch=2)
    causal = kv.causal_attention(*args)
    for kwargs in ({"window": None}, {"n_sink": 3}, {"window": t_len}, {"window": t_len + 5, "n_sink": 2}):
        np.testing.assert_array_equal(kv.causal_attention(*args, **kwargs), causal)


def test_banded_reference_float32():
    args = problem(9, dtype=np.float32)
    out = kv.causal_attention(*args, window=4, n_sink=1)
    assert out.dtype == np.float32
    expected = naive_causal_attention(*args, window=4, n_sink=1)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"window": 0}, ValueError, "window must be >= 1, got 0"),
        ({"window": -2}, ValueError, "window must be >= 1"),
        ({"window": 2.5}, TypeError, "window must be an integer, got 2.5"),
        ({"window": True}, TypeError, "window must be an integer"),
        ({"window": "3"}, TypeError, "window must be an integer"),
        ({"n_sink": -1}, ValueError, "n_sink must be >= 0, got -1"),
        ({"n_sink": None}, TypeError, "n_sink must be an integer, got None"),
        ({"window": 3, "n_sink": 1.0}, TypeError, "n_sink must be an integer"),
    ],
)
def test_bad_window_or_sinks_raise(kwargs, error, message):
    with pytest.raises(error, match=message):
        kv.causal_attention(*problem(4), **kwargs)
