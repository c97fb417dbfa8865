"""chunked_attention: every chunk size, window and sink count against the independent banded reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv

from ..references import attends, naive_causal_attention, problem
from .helpers import assert_ulps_close

T = 9  # small and odd, with D_model 4, D_k 3, D_v 5 (references.problem)
WINDOWS = {"none": None, "1": 1, "2": 2, "T-1": T - 1, "T": T, "T+2": T + 2}


def make_cache(kind, lead, window, n_sink, t_len=T, dtype=np.float64):
    """None (chunked_attention's default), a StaticCache of t_len positions, or the call's SlidingWindowCache."""
    if kind == "static":
        return kv.StaticCache(lead, t_len, 3, 5, dtype)
    if kind == "window":
        return kv.SlidingWindowCache(lead, window, 3, 5, n_sink=n_sink, dtype=dtype)
    return None


def cache_kinds(window):
    return ["default", "static"] + ([] if window is None else ["window"])


def state(cache):
    """Everything a caller could see of a cache, copied."""
    held = cache.held_positions().tolist() if hasattr(cache, "held_positions") else None
    k_cache, v_cache = (None if a is None else a.copy() for a in (cache.k_cache, cache.v_cache))  # None: no dtype yet
    return k_cache, v_cache, cache.get_seq_length(), held


def assert_same_state(cache, before):
    """The cache as it was: its buffers are copies of what was written, so bit for bit."""
    k_cache, v_cache, length, held = state(cache)
    np.testing.assert_array_equal(k_cache, before[0])
    np.testing.assert_array_equal(v_cache, before[1])
    assert (length, held) == before[2:]


@pytest.mark.parametrize("window", WINDOWS.values(), ids=WINDOWS.keys())
@pytest.mark.parametrize("n_sink", [0, 2])
def test_every_chunk_size_matches_the_banded_reference(window, n_sink):
    args = problem(T)
    expected = naive_causal_attention(*args, window=window, n_sink=n_sink)
    for chunk_size in range(1, T + 2):
        for kind in cache_kinds(window):
            cache = make_cache(kind, (), window, n_sink)
            out = kv.chunked_attention(*args, chunk_size=chunk_size, window=window, n_sink=n_sink, cache=cache)
            assert out.shape == (T, 5) and out.dtype == np.float64
            np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10, err_msg=f"{kind}, chunk {chunk_size}")
            if cache is not None:
                assert cache.get_seq_length() == T


@pytest.mark.parametrize("window", [2, 3, 4])
@pytest.mark.parametrize("n_sink", [0, 1])
def test_decode_around_the_moment_the_window_first_fills(window, n_sink):
    # Token by token into one cache; the steps t = W-1, W, W+1 are where transformers#37574 went wrong.
    args = problem(window + 4)
    x = args[0]
    expected = naive_causal_attention(*args, window=window, n_sink=n_sink)
    cache = kv.SlidingWindowCache((), window, 3, 5, n_sink=n_sink)
    for t in range(window + 4):
        out = kv.chunked_attention(x[t : t + 1], *args[1:], chunk_size=1, window=window, n_sink=n_sink, cache=cache)
        np.testing.assert_allclose(out[0], expected[t], rtol=1e-10, atol=1e-10, err_msg=f"step {t}")
        attended = [s for s in range(t + 1) if attends(t, s, window, n_sink)]
        assert len(attended) == min(t + 1, window + min(n_sink, max(t + 1 - window, 0)))
        assert set(attended) <= set(cache.held_positions().tolist()) | {t}
        assert len(cache.held_positions()) <= window + n_sink


@pytest.mark.parametrize("chunk_size", [5, 8, 13])
@pytest.mark.parametrize("n_sink", [0, 2])
def test_chunks_longer_than_the_window_into_the_ring(chunk_size, n_sink):
    # A chunk of more than W positions overwrites, in the ring, keys its own first queries need (mistral.rs #2333).
    args = problem(26)
    cache = kv.SlidingWindowCache((), 3, 3, 5, n_sink=n_sink)
    out = kv.chunked_attention(*args, chunk_size=chunk_size, window=3, n_sink=n_sink, cache=cache)
    np.testing.assert_allclose(out, naive_causal_attention(*args, window=3, n_sink=n_sink), rtol=1e-10, atol=1e-10)
    assert cache.k_cache.shape == (3 + n_sink, 3) and cache.get_seq_length() == 26


@pytest.mark.parametrize("kind, window, n_sink", [("static", None, 0), ("static", 4, 2), ("window", 4, 0),
                                                   ("window", 4, 2), ("window", 20, 1)])
def test_prefill_of_7_then_a_chunk_of_9_is_one_pass_of_16(kind, window, n_sink):
    args = problem(16)
    x, weights = args[0], args[1:]
    cache = make_cache(kind, (), window, n_sink, t_len=16)
    first = kv.chunked_attention(x[:7], *weights, chunk_size=7, window=window, n_sink=n_sink, cache=cache)
    then = kv.chunked_attention(x[7:], *weights, chunk_size=9, window=window, n_sink=n_sink, cache=cache)
    np.testing.assert_allclose(np.concatenate([first, then]), naive_causal_attention(*args, window=window, n_sink=n_sink),
                               rtol=1e-10, atol=1e-10)
    assert cache.get_seq_length() == 16


@pytest.mark.parametrize("window, n_sink", [(None, 0), (3, 0), (3, 1)])
def test_batched_inputs_keep_sequences_apart(window, n_sink):
    args = problem(T, batch=3)
    expected = naive_causal_attention(*args, window=window, n_sink=n_sink)
    for chunk_size in (1, 4, T):
        for kind in cache_kinds(window):
            cache = make_cache(kind, (3,), window, n_sink)
            out = kv.chunked_attention(*args, chunk_size=chunk_size, window=window, n_sink=n_sink, cache=cache)
            assert out.shape == (3, T, 5)
            np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10, err_msg=f"{kind}, chunk {chunk_size}")


@pytest.mark.parametrize("window, n_sink", [(None, 0), (3, 0), (4, 2)])
def test_float32_computes_in_float32_close_to_float64(window, n_sink):
    args = problem(T, batch=2, dtype=np.float32)
    expected = naive_causal_attention(*args, window=window, n_sink=n_sink)
    for chunk_size in (1, 3, T + 1):
        cache = make_cache("window" if window else "static", (2,), window, n_sink, dtype=np.float32)
        out = kv.chunked_attention(*args, chunk_size=chunk_size, window=window, n_sink=n_sink, cache=cache)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_chunk_size_one_is_the_preallocated_decode():
    # Two implementations of the same steps (chunked's and the decode's): within a few ULPs, not bit for bit.
    args = problem(T)
    assert_ulps_close(kv.chunked_attention(*args, chunk_size=1), kv.cached_attention_preallocated(*args))


def test_one_chunk_is_the_reference():
    args = problem(T, batch=2)
    for kwargs in ({}, {"window": 3}, {"window": 2, "n_sink": 1}):
        assert_ulps_close(kv.chunked_attention(*args, chunk_size=T, **kwargs), kv.causal_attention(*args, **kwargs))


def test_a_dynamic_cache_serves_too():
    args = problem(T)
    cache = kv.DynamicCache()
    out = kv.chunked_attention(*args, chunk_size=4, window=3, cache=cache)
    np.testing.assert_allclose(out, naive_causal_attention(*args, window=3), rtol=1e-10, atol=1e-10)
    assert cache.get_seq_length() == T


def test_the_window_cache_holds_o_of_w_while_the_full_cache_grows():
    args = problem(40)
    window_cache, full_cache = kv.SlidingWindowCache((), 4, 3, 5, n_sink=1), kv.StaticCache((), 40, 3, 5)
    kv.chunked_attention(*args, chunk_size=1, window=4, n_sink=1, cache=window_cache)
    kv.chunked_attention(*args, chunk_size=1, window=4, n_sink=1, cache=full_cache)
    assert window_cache.nbytes == 5 * (3 + 5) * 8 and window_cache.k_cache.shape == (5, 3)
    assert full_cache.nbytes == 40 * (3 + 5) * 8


def test_empty_input_returns_empty_and_leaves_the_cache():
    x, w_q, w_k, w_v = problem(0, batch=2)
    cache = kv.SlidingWindowCache((2,), 3, 3, 5)
    kv.chunked_attention(problem(4, batch=2)[0], w_q, w_k, w_v, chunk_size=2, window=3, cache=cache)
    before = state(cache)
    out = kv.chunked_attention(x, w_q, w_k, w_v, chunk_size=2, window=3, cache=cache)
    assert out.shape == (2, 0, 5)
    assert_same_state(cache, before)


# Bad input: a clear error, and the cache exactly as it was


def prefilled_window_cache():
    args = problem(12)
    cache = kv.SlidingWindowCache((), 4, 3, 5, n_sink=1)
    kv.chunked_attention(*args, chunk_size=5, window=4, n_sink=1, cache=cache)  # 12 positions: the ring has wrapped
    return args, cache


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"chunk_size": 0}, ValueError, "chunk_size must be >= 1, got 0"),
        ({"chunk_size": -3}, ValueError, "chunk_size must be >= 1"),
        ({"chunk_size": 2.0}, TypeError, "chunk_size must be an integer, got 2.0"),
        ({"chunk_size": True}, TypeError, "chunk_size must be an integer"),
        ({"chunk_size": None}, TypeError, "chunk_size must be an integer"),
        ({"window": 0}, ValueError, "window must be >= 1"),
        ({"window": 4.0}, TypeError, "window must be an integer"),
        ({"n_sink": -1}, ValueError, "n_sink must be >= 0"),
        ({"n_sink": "1"}, TypeError, "n_sink must be an integer"),
        ({"window": 5}, ValueError, r"cache keeps window=4, n_sink=1 but the call has window=5, n_sink=1"),
        ({"n_sink": 0}, ValueError, r"cache keeps window=4, n_sink=1 but the call has window=4, n_sink=0"),
        ({"window": None}, ValueError, "full attention needs a cache of every position"),
    ],
)
def test_bad_arguments_raise_and_leave_the_cache(kwargs, error, message):
    args, cache = prefilled_window_cache()
    before = state(cache)
    call = {"chunk_size": 3, "window": 4, "n_sink": 1, **kwargs}
    with pytest.raises(error, match=message):
        kv.chunked_attention(*args, **call, cache=cache)
    assert_same_state(cache, before)


def test_nan_in_the_last_chunk_raises_before_any_chunk_is_written():
    args, cache = prefilled_window_cache()
    x = args[0].copy()
    x[-1, 2] = np.nan
    before = state(cache)
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        kv.chunked_attention(x, *args[1:], chunk_size=3, window=4, n_sink=1, cache=cache)
    assert_same_state(cache, before)


@pytest.mark.parametrize(
    "cache, error, message",
    [
        (kv.SlidingWindowCache((2,), 4, 3, 5, n_sink=1), ValueError, "cache does not fit x"),
        (kv.SlidingWindowCache((), 4, 2, 5, n_sink=1), ValueError, "cache does not fit x"),
        (kv.SlidingWindowCache((), 4, 3, 5, n_sink=1, dtype=np.float32), TypeError, "cache holds float32"),
        (kv.StaticCache((), 5, 3, 5), ValueError, "cache too short"),
        (kv.StaticCache, TypeError, "must be a kv_attention.Cache instance"),
        ("cache", TypeError, "must be a kv_attention.Cache instance"),
    ],
    ids=["batch", "d_k", "dtype", "short", "class", "str"],
)
def test_a_cache_that_does_not_fit_is_refused(cache, error, message):
    args = problem(12)
    before = state(cache) if hasattr(cache, "get_seq_length") and not isinstance(cache, type) else None
    with pytest.raises(error, match=message):
        kv.chunked_attention(*args, chunk_size=3, window=4, n_sink=1, cache=cache)
    if before is not None:
        assert_same_state(cache, before)


class FailingCache(kv.SlidingWindowCache):
    """A window cache whose update raises on its n-th call, after earlier chunks overwrote its ring."""

    def __init__(self, *args, fail_at, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.fail_at = 0, fail_at

    def update(self, k, v):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected failure")
        return super().update(k, v)


def test_decode_paths_refuse_a_window_cache():
    # Full-attention decode through a cache that dropped keys would be silently wrong.
    x, w_q, w_k, w_v = problem(T)
    with pytest.raises(ValueError, match="full attention needs a cache of every position"):
        kv.cached_attention(x, w_q, w_k, w_v, cache=kv.SlidingWindowCache((), 4, 3, 5))
    hx = np.ones((2, 5, 4))
    with pytest.raises(ValueError, match="cache keeps window=4"):
        kv.multi_head_decode(hx, np.ones((4, 6)), np.ones((4, 3)), np.ones((4, 3)), np.ones((6, 4)),
                             n_heads=2, n_kv_heads=1, cache=kv.SlidingWindowCache((2, 1), 4, 3, 3))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_property_any_chunks_windows_sinks_and_split(data):
    t_len = data.draw(st.integers(0, 14), label="T")
    window = data.draw(st.none() | st.integers(1, t_len + 2), label="window")
    n_sink = data.draw(st.integers(0, 4), label="n_sink")
    batch = data.draw(st.none() | st.integers(1, 2), label="batch")
    split = data.draw(st.integers(0, t_len), label="prefill length")  # a prefill, then the rest in other chunks
    sizes = [data.draw(st.integers(1, t_len + 2), label=f"chunk_size {i}") for i in range(2)]
    kind = data.draw(st.sampled_from(cache_kinds(window)), label="cache")
    args = problem(t_len, batch, seed=data.draw(st.integers(0, 2**16), label="seed"))
    lead = () if batch is None else (batch,)
    x, weights = args[0], args[1:]
    cache = make_cache("static" if kind == "default" else kind, lead, window, n_sink, t_len=t_len)
    parts = [kv.chunked_attention(x[..., :split, :], *weights, chunk_size=sizes[0], window=window, n_sink=n_sink,
                                  cache=cache),
             kv.chunked_attention(x[..., split:, :], *weights, chunk_size=sizes[1], window=window, n_sink=n_sink,
                                  cache=cache)]
    expected = naive_causal_attention(*args, window=window, n_sink=n_sink)
    np.testing.assert_allclose(np.concatenate(parts, axis=-2), expected, rtol=1e-10, atol=1e-10)
    if kind == "default":  # and in one call with the default cache
        out = kv.chunked_attention(*args, chunk_size=sizes[0], window=window, n_sink=n_sink)
        np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10)
    assert cache.get_seq_length() == t_len
