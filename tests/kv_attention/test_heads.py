"""Multi-head, GQA and MQA: every head against its own single-head computation, both decode paths.

n_heads = 6, n_kv_heads = 2 where not stated. Query head h reads K/V head h // 3
(0, 0, 0, 1, 1, 1); the wrong mapping h % 2 gives (0, 1, 0, 1, 0, 1), so heads 1
and 4 tell the two apart, and a test of every head catches the wrong one.
"""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv
from kv_attention import heads as heads_module

from ..references import heads_problem, naive_head, naive_multi_head
from .helpers import HEADS_FUNCTIONS, HEADS_PATHS, heads_decode, heads_reference

@pytest.mark.parametrize("batch", [None, 3])
def test_every_head_matches_its_single_head_computation(heads_function, batch):
    x, w_q, w_k, w_v, _ = heads_problem(9, batch)
    out = heads_function(x, w_q, w_k, w_v, np.eye(18))  # w_o = I: the output is the 6 heads side by side
    assert out.shape == x.shape[:-1] + (18,)
    for h in range(6):
        np.testing.assert_allclose(
            out[..., 3 * h : 3 * h + 3], naive_head(x, w_q, w_k, w_v, h, 6, 2), rtol=1e-10, atol=1e-10,
            err_msg=f"query head {h}",
        )


def test_the_wrong_mapping_h_mod_n_kv_heads_would_be_caught(heads_function):
    # Heads 1 and 4 read K/V head 0 and 1 under h // 3, but 1 and 0 under h % 2.
    x, w_q, w_k, w_v, _ = heads_problem(9)
    out = heads_function(x, w_q, w_k, w_v, np.eye(18))
    for h in (1, 4):
        wrong = naive_head(x, w_q, w_k, w_v, h, 6, 2, kv_of=lambda h: h % 2)
        assert np.abs(out[..., 3 * h : 3 * h + 3] - wrong).max() > 1e-3


@pytest.mark.parametrize(
    "n_heads, n_kv_heads",
    [(6, 6), (6, 3), (6, 2), (6, 1), (1, 1), (4, 1)],
    ids=["mha", "gqa-g2", "gqa-g3", "mqa", "one-head", "mqa-4"],
)
@pytest.mark.parametrize("batch", [None, 1, 4])
def test_float64_with_output_projection_matches_naive(heads_function, n_heads, n_kv_heads, batch):
    args = heads_problem(7, batch, n_heads=n_heads, n_kv_heads=n_kv_heads)
    out = heads_function(*args, n_heads=n_heads, n_kv_heads=n_kv_heads)
    assert out.dtype == np.float64 and out.shape == args[0].shape[:-1] + (4,)
    expected = naive_multi_head(*args, n_heads, n_kv_heads)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10)


def test_float32_stays_float32_and_matches_float64(heads_function):
    args32 = heads_problem(11, 3, dtype=np.float32)
    out = heads_function(*args32)
    assert out.dtype == np.float32
    expected = naive_multi_head(*(a.astype(np.float64) for a in args32), 6, 2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_mixed_float32_and_float64_computes_in_float64(heads_function):
    x, w_q, w_k, w_v, w_o = heads_problem(5, 3)
    out = heads_function(x.astype(np.float32), w_q, w_k, w_v, w_o.astype(np.float32))
    assert out.dtype == np.float64
    expected = naive_multi_head(x.astype(np.float32), w_q, w_k, w_v, w_o.astype(np.float32), 6, 2)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path", HEADS_PATHS)
def test_one_head_with_identity_w_o_reproduces_the_single_head_functions(path):
    x, w_q, w_k, w_v, _ = heads_problem(8, None, n_heads=1, n_kv_heads=1, d_model=5, head_dim=3)
    eye = np.eye(3)
    one_head = dict(n_heads=1, n_kv_heads=1)
    decoded = heads_decode(x, w_q, w_k, w_v, eye, path=path, **one_head)
    whole = heads_reference(x, w_q, w_k, w_v, eye, **one_head)
    for single in (kv.causal_attention, kv.cached_attention_preallocated, kv.cached_attention):
        expected = single(x, w_q, w_k, w_v)
        np.testing.assert_allclose(decoded, expected, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(whole, expected, rtol=1e-10, atol=1e-10)
    xb = heads_problem(8, 3, **one_head)[0]
    np.testing.assert_allclose(heads_decode(xb, w_q, w_k, w_v, eye, path=path, **one_head),
                               kv.batched_cached_attention(xb, w_q, w_k, w_v), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path", HEADS_PATHS)
@pytest.mark.parametrize("t_changed", [0, 4, 8])
def test_changing_x_t_changes_no_earlier_output(path, t_changed):
    args = heads_problem(9)
    before = heads_decode(*args, path=path)
    x2 = args[0].copy()
    x2[:, t_changed] += 10.0
    after = heads_decode(x2, *args[1:], path=path)
    # Steps before t_changed run the same computation on the same inputs: bit for bit, or they read x[t_changed].
    np.testing.assert_array_equal(after[:, :t_changed], before[:, :t_changed])
    assert not np.allclose(after[:, t_changed], before[:, t_changed])


def test_batch_axis_never_mixes_sequences(heads_function):
    args = heads_problem(6, 4)
    out = heads_function(*args)
    for b in range(4):
        expected = naive_multi_head(args[0][b], *args[1:], 6, 2)  # sequence b alone
        np.testing.assert_allclose(out[b], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path", HEADS_PATHS)
def test_the_cache_holds_each_kv_head_of_each_sequence(path):
    x, w_q, w_k, w_v, w_o = heads_problem(7, 3)
    cache = kv.StaticCache((3, 2), 7, 3, 3)  # [B, H_kv, T_max, D_head]
    heads_decode(x, w_q, w_k, w_v, w_o, path=path, cache=cache)
    for b in range(3):
        for j in range(2):
            np.testing.assert_allclose(cache.k_cache[b, j], x[b] @ w_k[:, 3 * j : 3 * j + 3], rtol=1e-12)
            np.testing.assert_allclose(cache.v_cache[b, j], x[b] @ w_v[:, 3 * j : 3 * j + 3], rtol=1e-12)
    assert cache.nbytes == 2 * 3 * 2 * 7 * 3 * 8  # 2 (K, V) x B x H_kv x T x D_head x 8 bytes
    assert cache.nbytes == kv.kv_cache_bytes(batch=3, seq_len=7, n_layers=1, n_kv_heads=2, head_dim=3,
                                             dtype=np.float64)


@pytest.mark.parametrize("path", HEADS_PATHS)
@pytest.mark.parametrize("make_cache", [lambda: kv.StaticCache((3, 2), 11, 3, 3), kv.DynamicCache],
                         ids=["static", "dynamic"])
def test_decode_continues_from_a_filled_cache(path, make_cache):
    # Decoding x[:, :4] then x[:, 4:] into one cache equals decoding x at once.
    args = heads_problem(11)
    cache = make_cache()
    first = heads_decode(args[0][:, :4], *args[1:], path=path, cache=cache)
    second = heads_decode(args[0][:, 4:], *args[1:], path=path, cache=cache)
    assert cache.get_seq_length() == 11
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), naive_multi_head(*args, 6, 2),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_grouped_path_attends_on_the_caches_own_memory(monkeypatch, n_kv_heads):
    """Every K/V the grouped path attends over is a view of the cache; repeat_kv's are copies."""
    seen = []

    def recording_attend(q, k, v, _attend=heads_module.attention_forward):
        seen.append((k, v))
        return _attend(q, k, v)

    monkeypatch.setattr(heads_module, "attention_forward", recording_attend)
    args = heads_problem(5, n_kv_heads=n_kv_heads)
    for path, shared in (("grouped", True), ("repeat_kv", False)):
        seen.clear()
        cache = kv.StaticCache((3, n_kv_heads), 5, 3, 3)
        heads_decode(*args, n_kv_heads=n_kv_heads, path=path, cache=cache)
        assert len(seen) == 5
        for k, v in seen:
            assert np.shares_memory(k, cache.k_cache) is shared, path
            assert np.shares_memory(v, cache.v_cache) is shared, path


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_grouped_path_allocates_no_copy_of_k_and_v(n_kv_heads):
    """Peak bytes allocated during a decode into a given cache (tracemalloc sees numpy's allocations).

    One repeated copy of K at the last step is B·H_q·T·D_head·8 bytes. repeat_kv
    holds two (K and V) at once; grouped holds only scores, [B, H_q, T] floats,
    and small temporaries: under a quarter of one copy at D_head = 32.
    """
    batch, t_len, n_heads, head_dim = 2, 256, 8, 32
    one_copy = batch * n_heads * t_len * head_dim * 8  # 1 MiB
    args = heads_problem(t_len, batch, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=8, head_dim=head_dim)
    peaks = {}
    for path in HEADS_PATHS:
        heads_decode(*args, n_heads=n_heads, n_kv_heads=n_kv_heads, path=path)  # warm-up: lazy imports (np.ma)
        cache = kv.StaticCache((batch, n_kv_heads), t_len, head_dim, head_dim, np.float64)  # allocated now
        tracemalloc.start()
        try:
            heads_decode(*args, n_heads=n_heads, n_kv_heads=n_kv_heads, path=path, cache=cache)
            peaks[path] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks["repeat_kv"] >= 2 * one_copy, peaks  # the measurement does see copies of K and V
    assert peaks["grouped"] < one_copy / 4, peaks


@st.composite
def head_problems(draw):
    """(args, n_heads, n_kv_heads) with random head counts, widths, T, B and input scale."""
    n_kv_heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    batch = draw(st.sampled_from([None, 1, 2, 3]))
    args = heads_problem(
        draw(st.integers(1, 8)), batch, n_heads=n_kv_heads * group, n_kv_heads=n_kv_heads,
        d_model=draw(st.integers(1, 5)), head_dim=draw(st.integers(1, 4)), d_out=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    scale = draw(st.floats(1e-3, 10.0))
    return (args[0] * scale, *args[1:]), n_kv_heads * group, n_kv_heads


@settings(max_examples=40, deadline=None)
@given(problem=head_problems(), name=st.sampled_from(sorted(HEADS_FUNCTIONS)))
def test_random_shapes_match_naive(problem, name):
    args, n_heads, n_kv_heads = problem
    out = HEADS_FUNCTIONS[name](*args, n_heads=n_heads, n_kv_heads=n_kv_heads)
    np.testing.assert_allclose(out, naive_multi_head(*args, n_heads, n_kv_heads), rtol=1e-10, atol=1e-10)


# --- bad input: a clear error naming the numbers, and nothing changed ------------------------------

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
        np.testing.assert_array_equal(a, original)  # against a copy


def _filled_cache(t_len=3, t_max=8):
    """A StaticCache (3, 2) holding the first t_len positions of heads_problem's x."""
    cache = kv.StaticCache((3, 2), t_max, 3, 3)
    heads_decode(*heads_problem(t_len), cache=cache)
    return cache


@pytest.mark.parametrize(
    "cache, error, message",
    [
        (kv.StaticCache((3, 3), 9, 3, 3), ValueError, r"k_cache \[3, 3, T, 3\] .* must be \[3, 2, T, 3\]"),
        (kv.StaticCache((3, 2), 9, 2, 3), ValueError, r"cache does not fit x: k_cache \[3, 2, T, 2\]"),
        (kv.StaticCache((2, 2), 9, 3, 3), ValueError, r"cache does not fit x"),
        (kv.StaticCache((3,), 9, 3, 3), ValueError, r"cache does not fit x"),
        (kv.StaticCache((3, 2), 9, 3, 3, np.float32), TypeError, r"cache holds float32 but the computation is f"),
        (kv.StaticCache((3, 2), 5, 3, 3), ValueError, r"cache too short: 0 of max_seq_len=5 .* x needs T=6"),
        ("not a cache", TypeError, r"cache must be a kv_attention.Cache instance"),
        (kv.StaticCache, TypeError, r"cache must be a kv_attention.Cache instance"),
    ],
)
@pytest.mark.parametrize("path", HEADS_PATHS)
def test_a_cache_that_does_not_fit_is_refused_and_unchanged(path, cache, error, message):
    with pytest.raises(error, match=message):
        heads_decode(*heads_problem(6), path=path, cache=cache)
    if isinstance(cache, kv.StaticCache):
        assert cache.get_seq_length() == 0
        assert cache.k_cache is None or not (cache.k_cache.any() or cache.v_cache.any())  # None: no dtype yet


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
    np.testing.assert_array_equal(cache.k_cache, k_before)  # untouched, against a copy


def _one_head_step(stored_key):
    """A one-head decode (D_model = D_head = 2) whose query is [1e200, 0], after a cache holding ``stored_key``.

    The new key is x @ I = [1, 0]: its score is 1e200 / sqrt(2), finite.
    """
    cache = kv.StaticCache((1, 1), 4, 2, 2)
    cache.update(np.array(stored_key, float).reshape(1, 1, 1, 2), np.ones((1, 1, 1, 2)))
    x, eye = np.array([[[1.0, 0.0]]]), np.eye(2)
    return cache, (x, eye * 1e200, eye, eye, eye)


@pytest.mark.parametrize("position", [1, 2, 3])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_bad_weight_opposite_a_zero_of_x_is_found(position, bad):
    # The check reads no weight: it relies on 0 * NaN = NaN and 0 * inf = NaN reaching a score or the
    # output through x @ w, on whichever BLAS kernel runs (CI runs two).
    args = [a.copy() for a in heads_problem(4)]
    args[0][..., 0] = 0.0
    args[position][0, 0] = bad
    with pytest.raises(ValueError, match=rf"^{ARG_NAMES[position]} contains NaN or inf$"):
        heads_decode(*args)


def _over_the_bound():
    """x and weights whose bound |x|·|w_q|_F·|x|·|w_k|_F is 1e400 but whose q·k is 0: computed, not refused."""
    x = np.array([[[1e100, 0.0]]])
    w_q, w_k = np.array([[1e100, 0.0], [0.0, 0.0]]), np.array([[0.0, 1e100], [0.0, 0.0]])
    return x, w_q, w_k, np.array([[1e-100, 0.0], [0.0, 0.0]]), np.eye(2)


def test_inputs_over_the_bound_that_do_not_overflow_are_computed():
    cache = kv.StaticCache((1, 1), 4, 2, 2)
    cache.update(np.array([[[[0.0, 1.0]]]]), np.array([[[[1.0, 1.0]]]]))
    out = heads_decode(*_over_the_bound(), n_heads=1, n_kv_heads=1, cache=cache)
    # q = [1e200, 0] scores 0 against k_0 = [0, 1] and k_1 = [0, 1e200]: the mean of v_0 = [1, 1] and v_1 = [1, 0]
    np.testing.assert_allclose(out, [[[1.0, 0.5]]], rtol=1e-14)


def test_a_failed_decode_leaves_a_dynamic_cache_with_its_dtype_and_axes():
    cache = kv.DynamicCache()
    cache.update(np.zeros((1, 1, 0, 2), np.float32), np.zeros((1, 1, 0, 2), np.float32))
    eye = np.eye(2, dtype=np.float32)
    with pytest.raises(ValueError, match="^x contains NaN or inf$"):
        heads_decode(np.array([[[np.nan, 1.0]]], np.float32), eye, eye, eye, eye, n_heads=1, n_kv_heads=1, cache=cache)
    assert cache.k_cache.shape == (1, 1, 0, 2) and cache.k_cache.dtype == np.float32
    with pytest.raises(TypeError, match="cache holds float32 but the computation is float64"):
        heads_decode(np.ones((1, 1, 2)), np.eye(2), np.eye(2), np.eye(2), np.eye(2), n_heads=1, n_kv_heads=1, cache=cache)


@pytest.mark.parametrize("batch", [None, 0, 3])
def test_nan_in_a_weight_is_found_when_no_score_is_computed(batch):
    x, w_q, *rest = heads_problem(0 if batch != 0 else 2, batch)
    w_q = w_q.copy()
    w_q[0, 0] = np.nan
    with pytest.raises(ValueError, match="^w_q contains NaN or inf$"):
        heads_decode(x, w_q, *rest)


def test_a_subclass_of_a_library_cache_names_the_decodes_argument():
    class MyStatic(kv.StaticCache):
        pass

    x, *weights = heads_problem(3)
    x = x.copy()
    x[0, 1, 0] = np.nan
    cache = MyStatic((3, 2), 8, 3, 3)
    with pytest.raises(ValueError, match="^x contains NaN or inf$"):
        heads_decode(x, *weights, cache=cache)
    assert cache.get_seq_length() == 0


