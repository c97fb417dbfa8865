"""causal_attention (the reference), attend and masked_attend (one step), against independent loop-by-loop computations."""

import numpy as np
import pytest

import kv_attention as kv
from kv_attention.attention import band_mask

from ..references import naive_attend, naive_causal_attention, problem


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
    # bool masks: exact
    np.testing.assert_array_equal(band_mask(positions, positions, window=2, n_sink=1), expected)
    # a chunk of queries 3, 4 after three cached positions: the causal diagonal is offset, not square
    np.testing.assert_array_equal(band_mask(np.array([3, 4]), positions, window=2, n_sink=1), expected[3:])


@pytest.mark.parametrize("t_len", [1, 6])
def test_no_window_and_a_window_past_t_are_exactly_the_causal_reference(t_len):
    # n_sink without a window changes nothing, and a window >= T masks nothing more than causality: the same
    # computation on the same inputs with the same mask, so bit for bit.
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


# --- one step: attend and masked_attend ----------------------------------------------------------


def step_inputs(lead=(3,), t_q=2, s=5, d_k=4, d_v=6, seed=1, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(lead + shape).astype(dtype) for shape in ((t_q, d_k), (s, d_k), (s, d_v)))
    return q, k, v


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])  # [T_q, D], [B, T_q, D], [B, H, T_q, D]
def test_attend_matches_naive(lead):
    q, k, v = step_inputs(lead)
    out = kv.attend(q, k, v)
    assert out.shape == lead + (2, 6) and out.dtype == np.float64
    np.testing.assert_allclose(out, naive_attend(q, k, v), rtol=1e-12, atol=1e-12)


def test_attend_in_float32():
    q, k, v = step_inputs(dtype=np.float32)
    out = kv.attend(q, k, v)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, naive_attend(q, k, v), rtol=1e-5, atol=1e-5)


def test_attend_over_the_keys_so_far_is_a_decode_step_of_causal_attention():
    x, w_q, w_k, w_v = problem(6)
    t = 4  # position 4 attends to positions 0..4
    out = kv.attend(x[t : t + 1] @ w_q, x[: t + 1] @ w_k, x[: t + 1] @ w_v)
    np.testing.assert_allclose(out[0], naive_causal_attention(x, w_q, w_k, w_v)[t], rtol=1e-12)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_masked_attend_matches_naive_over_the_valid_keys(lead):
    q, k, v = step_inputs(lead)
    valid = np.random.default_rng(2).random(lead + (5,)) < 0.6
    valid[(0,) * len(lead)] = False  # one row with nothing to attend to: zeros
    out = kv.masked_attend(q, k, v, valid)
    assert out.shape == lead + (2, 6)
    np.testing.assert_allclose(out, naive_attend(q, k, v, valid), rtol=1e-12, atol=1e-12)
    assert (out[(0,) * len(lead)] == 0).all()


def test_masked_attend_with_every_key_valid_is_attend():
    q, k, v = step_inputs()
    # With every key valid, masked_attend runs attend's own code: the same computation, so bit for bit.
    np.testing.assert_array_equal(kv.masked_attend(q, k, v, np.ones((3, 5), dtype=bool)), kv.attend(q, k, v))


def test_masked_keys_may_be_huge():
    q, k, v = step_inputs()
    valid = np.array([[True, True, False, False, False]] * 3)
    k[:, 2:], v[:, 2:] = 1e308, -1e308  # q·k would overflow, and |v| is past half of float64's range
    with np.errstate(all="raise"):
        out = kv.masked_attend(q, k, v, valid)
    np.testing.assert_allclose(out, naive_attend(q, k[:, :2], v[:, :2]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_masked_key_or_value_may_hold_nan_or_inf_its_content_does_not_matter(bad):
    q, k, v = step_inputs()
    valid = np.array([[True, True, False, False, True], [False, True, True, True, True], [False] * 5])
    finite = kv.masked_attend(q, k, v, valid)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[~valid], v_bad[~valid] = bad, bad
    with np.errstate(all="raise"):
        out = kv.masked_attend(q, k_bad, v_bad, valid)
    np.testing.assert_allclose(out, naive_attend(q, k, v, valid), rtol=1e-12, atol=1e-12)
    # The same products on the same valid keys, the masked terms 0 · value = 0 added exactly: bit for bit.
    np.testing.assert_array_equal(out, finite)
    assert not np.isfinite(k_bad[~valid]).any() and not np.isfinite(v_bad[~valid]).any()  # the caller's, unwritten
    k_bad[0, 0, 0] = bad  # a valid key: refused, naming k
    with pytest.raises(ValueError, match=r"^k at a valid key contains NaN or inf$"):
        kv.masked_attend(q, k_bad, v, valid)
    v_bad[1, 1, 2] = bad
    with pytest.raises(ValueError, match=r"^v at a valid key contains NaN or inf$"):
        kv.masked_attend(q, k, v_bad, valid)


def test_no_key_position_gives_zeros():
    q, k, v = step_inputs(s=0)
    for out in (kv.attend(q, k, v), kv.masked_attend(q, k, v, np.ones((3, 0), dtype=bool))):
        assert out.shape == (3, 2, 6) and out.dtype == np.float64 and not out.any()


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda q, k, v: (q, k[:, :, :3], v), ValueError, r"q and k must share D_k, .*: q \(3, 2, 4\), k \(3, 5, 3\)"),
        (lambda q, k, v: (q, k, v[:, :4]), ValueError, r"k and v the S axis: q \(3, 2, 4\), k \(3, 5, 4\), v \(3, 4, 6\)"),
        (lambda q, k, v: (q[:2], k, v), ValueError, r"with the same leading axes, got q \(2, 2, 4\), k \(3, 5, 4\)"),
        (lambda q, k, v: (q[0, 0], k, v), ValueError, r"must be \[\.\.\., T_q, D_k\]"),
        (lambda q, k, v: (q[..., :0], k[..., :0], v), ValueError, r"D_k must be at least 1"),
        (lambda q, k, v: (q.astype(np.int64), k, v), TypeError, r"q must be a float32 or float64 array"),
        (lambda q, k, v: (q, np.where(k > 1, np.nan, k), v), ValueError, r"^k contains NaN or inf$"),
    ],
)
def test_attend_refuses_bad_input(change, error, message):
    with pytest.raises(error, match=message):
        kv.attend(*change(*step_inputs()))


def test_attend_checks_what_it_computes_not_a_bound():
    # Values at 1e308 (|v_s| = 2.4e308 over D_v = 6 exceeds the bound masked_attend keeps) average to 1e308:
    # attend computes them, and checks that every score and the output are finite.
    q, k, v = step_inputs()
    np.testing.assert_allclose(kv.attend(q, k, np.full_like(v, 1e308)), np.full((3, 2, 6), 1e308), rtol=1e-14)


def test_nan_in_k_or_v_is_found_when_no_score_is_computed():
    q, k, v = step_inputs()
    k[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="^k contains NaN or inf$"):
        kv.attend(q[:, :0], k, v)  # T_q = 0


@pytest.mark.parametrize(
    "valid, error, message",
    [
        (np.ones((3, 5), dtype=np.int64), TypeError, r"valid must be a bool array, got dtype int64"),
        (np.ones((3, 4), dtype=bool), ValueError, r"valid must be \[\.\.\., S\] = \[3, 5\] for k \(3, 5, 4\), got shape \(3, 4\)"),
        (np.ones((3, 1, 5), dtype=bool), ValueError, r"valid must be \[\.\.\., S\]"),
    ],
)
def test_masked_attend_refuses_a_bad_mask(valid, error, message):
    with pytest.raises(error, match=message):
        kv.masked_attend(*step_inputs(), valid)


@pytest.mark.parametrize(
    "valid, what",
    [(None, "None"), (np.ma.array(np.ones((3, 5), dtype=bool), mask=np.eye(3, 5, dtype=bool)), "a masked array")],
)
def test_masked_attend_refuses_none_or_a_masked_array_as_the_mask_naming_valid(valid, what):
    # None once reached the mask's indexing (IndexError); a masked array's mask would be dropped by np.asarray.
    with pytest.raises(TypeError, match=rf"^valid must be a bool array \[\.\.\., S\] = \[3, 5\] for k \(3, 5, 4\), got {what}$"):
        kv.masked_attend(*step_inputs(), valid)
    with pytest.raises(TypeError, match=r"valid must be a bool array \[\.\.\., S\] = \[3\] for k \(3, 4\), got None"):
        kv.masked_attend(np.ones((1, 4)), np.ones((3, 4)), np.ones((3, 2)), None)
