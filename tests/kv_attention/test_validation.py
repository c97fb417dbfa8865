"""The overflow guard, through every entry point: what it lets pass, what it refuses, and how it says so.

The guard bounds every partial sum of q·k by |q_t|·|k_s| <= |x_t|²·|w_q|_F·|w_k|_F
(and q, k, v likewise) against half the dtype's largest value. Each norm is
scaled before it is squared, so inputs of any magnitude whose q, k and v are
moderate pass; only bounds that truly exceed the dtype are refused, with a
message naming each bound that tripped and its figure.
"""

import numpy as np
import pytest

import kv_attention as kv

from ..references import BATCHED, SINGLE, heads_problem, naive_causal_attention, strategy_problem
from .helpers import HEADS_FUNCTIONS, run

F64_MAX, F32_MAX = float(np.finfo(np.float64).max), float(np.finfo(np.float32).max)


def scaled(args, x_scale, w_scale, dtype=np.float64):
    """x times x_scale and every weight times w_scale, computed in float64 and then cast to dtype."""
    x, *weights = (np.asarray(a, dtype=np.float64) for a in args)
    return tuple(a.astype(dtype) for a in (x * x_scale, *(w * w_scale for w in weights)))


# --- inputs of any magnitude whose projections are moderate pass --------------------------------


@pytest.mark.parametrize("x_scale", [1e154, 1e300, 1e-300])
def test_huge_or_tiny_x_with_inverse_weights_passes(strategy, x_scale):
    # |x| near 1e155 once overflowed the squared norm; q, k and v are the unscaled ones, about 1.
    args = strategy_problem(strategy, 6)
    out = run(strategy, *scaled(args, x_scale, 1 / x_scale))
    np.testing.assert_allclose(out, naive_causal_attention(*args), rtol=1e-9, atol=1e-9)


def test_float32_inputs_beyond_float32_squares_pass():
    # x of 1e19 squares to 1e38·D_model, past float32's 3.4e38; the exact path takes it in float64.
    args = strategy_problem("preallocated", 6)
    out = kv.cached_attention_preallocated(*scaled(args, 1e19, 1e-19, np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, naive_causal_attention(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(HEADS_FUNCTIONS))
def test_heads_pass_huge_x_with_inverse_weights(name):
    x, w_q, w_k, w_v, w_o = heads_problem(5)
    expected = HEADS_FUNCTIONS[name](x, w_q, w_k, w_v, w_o)
    out = HEADS_FUNCTIONS[name](x * 1e154, w_q * 1e-154, w_k * 1e-154, w_v * 1e-154, w_o)
    np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("strategy", kv.RAGGED_STRATEGIES)
def test_ragged_passes_huge_x_with_inverse_weights(strategy):
    x, w_q, w_k, w_v = strategy_problem("batched", 5)
    out = kv.ragged_decode(*scaled((x, w_q, w_k, w_v), 1e154, 1e-154), lengths=[5, 3, 1], strategy=strategy)
    for b, n in enumerate([5, 3, 1]):
        np.testing.assert_allclose(out[b, :n], naive_causal_attention(x[b, :n], w_q, w_k, w_v), rtol=1e-9, atol=1e-9)


# --- near the limits of float64 and float32 ------------------------------------------------------
# D = 1 and unit weights: q_t = k_t = v_t = x_t exactly, and the bound |q|·|k| = c² is exact.
# x = [c, -c]: position 1 scores -c² against key 0 and +c² against itself, so it outputs -c.


@pytest.mark.parametrize("dtype, c", [(np.float64, 9e153), (np.float32, 1.3e19)])
def test_scores_just_below_half_the_dtype_max_pass_exactly(strategy, dtype, c):
    assert c * c < float(np.finfo(dtype).max) / 2
    one = np.ones((1, 1), dtype)
    x = np.array([[c], [-c]], dtype)
    if strategy in BATCHED:
        x = np.stack([x, -x])
    # out_t = v_t = x_t: each position attends to itself alone (weights exactly 1 and 0), so exact.
    expected = x.astype(np.float64).astype(dtype)
    np.testing.assert_array_equal(run(strategy, x, one, one, one), expected)


# --- the message names the bound that tripped ----------------------------------------------------


@pytest.fixture(params=SINGLE + BATCHED)
def name(request):
    return request.param


def one_position(x=1.0, w_q=1.0, w_k=1.0, w_v=1.0):
    return tuple(np.full((1, 1), a) for a in (x, w_q, w_k, w_v))


