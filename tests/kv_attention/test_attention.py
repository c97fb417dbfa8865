"""causal_attention, the reference, against an independent loop-by-loop computation."""

import numpy as np
import pytest

import kv_attention as kv

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
