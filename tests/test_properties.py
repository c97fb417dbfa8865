"""Property-based tests (hypothesis) over random shapes, lengths, batch sizes and scales."""

import numpy as np
from conftest import BATCHED, SINGLE, naive_causal_attention, run
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv


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
    # Decoding x[:, :cut] reproduces the first cut positions of decoding all of x.
    x, w_q, w_k, w_v = args
    full = kv.batched_cached_attention(x, w_q, w_k, w_v)
    np.testing.assert_array_equal(kv.batched_cached_attention(x[:, :cut], w_q, w_k, w_v), full[:, :cut])
