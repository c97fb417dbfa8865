"""Every decode strategy equals the reference position by position, and is causal."""

import numpy as np
import pytest
from conftest import BATCHED, SINGLE, naive_causal_attention, problem, run, strategy_problem

import kv_attention as kv

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


@pytest.mark.parametrize("name", BATCHED)
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_batch_axis_never_mixes_sequences(name, batch):
    args = problem(6, batch)
    out = run(name, *args)
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
    np.testing.assert_array_equal(after[..., :t_changed, :], before[..., :t_changed, :])
    assert not np.allclose(after[..., t_changed, :], before[..., t_changed, :])


def test_registry_names_map_to_the_public_functions():
    assert kv.STRATEGIES == {
        "no_cache": kv.decode_without_cache,
        "concat": kv.cached_attention,
        "preallocated": kv.cached_attention_preallocated,
        "sequential": kv.sequential_cached_attention,
        "batched": kv.batched_cached_attention,
    }
    assert kv.EXPERIMENTS == {"cache": SINGLE, "batch": BATCHED}
    assert kv.get_strategy("batched") is kv.batched_cached_attention
    with pytest.raises(ValueError, match="unknown strategy 'paged'.*no_cache"):
        kv.get_strategy("paged")


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


def test_batched_decode_fills_a_b_by_t_cache():
    x, w_q, w_k, w_v = problem(6, 3)
    cache = kv.StaticCache((3,), 6, 3, 5)
    kv.batched_cached_attention(x, w_q, w_k, w_v, cache=cache)
    np.testing.assert_allclose(cache.k_cache, x @ w_k, rtol=1e-12)  # [B, T, D_k]
    np.testing.assert_allclose(cache.v_cache, x @ w_v, rtol=1e-12)  # [B, T, D_v]
