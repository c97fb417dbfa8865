"""Attention states, their log-sum-exp merge, split-KV and cascade attention, each against an independent reference.

Expectations come from tests/references.py (Python floats, one query row at a
time) or from an identity of the definition (no keys: zeros and -inf; one key: its
value). float64 is held to rtol = atol = 1e-12, float32 to 2e-4 against float64;
hypothesis draws shapes, split counts, partitions and scales.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv
from kv_attention import split as split_module
from kv_attention.attention import attend

from ..references import attention_problem, heads_problem, naive_attention_state, naive_multi_head
from .helpers import HEADS_PATHS, heads_decode

TOL64 = dict(rtol=1e-12, atol=1e-12)
TOL32 = dict(rtol=2e-4, atol=2e-4)
ODD_SIZES = [(1, 1), (1, 3), (3, 5), (2, 7), (1, 11), (3, 13)]  # (T_q, S)


def assert_state_close(state, expected, tol=TOL64, what=""):
    (out, lse), (expected_out, expected_lse) = state, expected
    assert out.shape == expected_out.shape and lse.shape == expected_lse.shape, what
    np.testing.assert_allclose(out, expected_out, err_msg=what, **tol)
    np.testing.assert_allclose(lse, expected_lse, err_msg=what, **tol)  # -inf must sit where the reference has it


def parts(q, k, v, bounds):
    """The attention state of each contiguous part ``bounds[i]:bounds[i+1]`` of the keys."""
    return [kv.attention_state(q, k[..., a:b, :], v[..., a:b, :]) for a, b in zip(bounds, bounds[1:])]


# --- attention_state: the (out, lse) of one set of keys ---------------------------------------------


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
@pytest.mark.parametrize("t_q, s_len", [(1, 1), (3, 5), (2, 11), (0, 4)])
def test_attention_state_matches_the_row_by_row_reference(lead, t_q, s_len):
    q, k, v = attention_problem(lead, t_q, s_len)
    out, lse = kv.attention_state(q, k, v)
    assert out.shape == lead + (t_q, 3) and lse.shape == lead + (t_q,)
    assert_state_close((out, lse), naive_attention_state(q, k, v))


def test_out_is_attend_bit_for_bit():
    # Documented: attention_state runs attend's operations in attend's order on the same arrays.
    q, k, v = attention_problem((2,), 3, 9)
    np.testing.assert_array_equal(kv.attention_state(q, k, v)[0], attend(q, k, v))


def test_equal_keys_give_lse_score_plus_log_s_and_the_mean_value():
    q, k, v = attention_problem((), 2, 1)
    k = np.repeat(k, 6, axis=0)  # six copies of one key: every score is s = q·k_0 / sqrt(5)
    v = np.random.default_rng(1).standard_normal((6, 3))
    out, lse = kv.attention_state(q, k, v)
    np.testing.assert_allclose(lse, (q @ k[0]) / math.sqrt(5) + math.log(6), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=0), (2, 3)), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_keys_give_the_identity_zeros_and_minus_inf(dtype):
    q, k, v = attention_problem((2,), 3, 0, dtype=dtype)
    out, lse = kv.attention_state(q, k, v)
    assert out.shape == (2, 3, 3) and lse.shape == (2, 3) and out.dtype == lse.dtype == dtype
    assert not out.any() and np.isneginf(lse).all()


def test_one_key_gives_its_value_exactly_and_its_score():
    q, k, v = attention_problem((2,), 3, 1)
    out, lse = kv.attention_state(q, k, v)
    np.testing.assert_array_equal(out, np.broadcast_to(v, out.shape))  # weight exp(0) / 1 = 1: exact
    np.testing.assert_allclose(lse, (q @ k.swapaxes(-1, -2))[..., 0] / math.sqrt(5), rtol=1e-15)


def test_float32_stays_float32_and_mixed_dtypes_promote():
    q, k, v = attention_problem((2,), 3, 7, dtype=np.float32)
    out, lse = kv.attention_state(q, k, v)
    assert out.dtype == lse.dtype == np.float32
    assert_state_close((out, lse), naive_attention_state(q, k, v), TOL32)
    out, lse = kv.attention_state(q, k.astype(np.float64), v)
    assert out.dtype == lse.dtype == np.float64
    assert_state_close((out, lse), naive_attention_state(q, k, v))


# --- the merge: exact, associative, with the empty state as its identity -----------------------------


@pytest.mark.parametrize("bounds", [[0, 6], [0, 2, 6], [0, 1, 2, 3, 4, 5, 6], [0, 3, 3, 6]])
def test_merging_the_parts_gives_the_state_of_all_keys(bounds):
    q, k, v = attention_problem((2,), 3, 6)
    assert_state_close(kv.merge_attention_states(parts(q, k, v, bounds)), naive_attention_state(q, k, v))


@pytest.mark.parametrize("position", range(4))
def test_an_empty_part_in_any_position_changes_nothing_bit_for_bit(position):
    # The identity's weight is exp(-inf) = 0 exactly, and adding 0 changes no sum: the same states merge bit for bit.
    q, k, v = attention_problem((2,), 3, 6)
    states = parts(q, k, v, [0, 2, 4, 6])
    empty = kv.attention_state(q, k[..., :0, :], v[..., :0, :])
    with_empty = states[:position] + [empty] + states[position:]
    merged, expected = kv.merge_attention_states(with_empty), kv.merge_attention_states(states)
    np.testing.assert_array_equal(merged[0], expected[0])
    np.testing.assert_array_equal(merged[1], expected[1])
    assert_state_close(merged, naive_attention_state(q, k, v))


@pytest.mark.parametrize("first", [True, False])
def test_the_identity_merged_with_a_state_returns_that_state_bit_for_bit(first):
    # The state's weight is exp(0) = 1 and the identity's exactly 0: exact arithmetic.
    q, k, v = attention_problem((2, 2), 3, 5)
    state = kv.attention_state(q, k, v)
    identity = (np.zeros_like(state[0]), np.full_like(state[1], -np.inf))
    merged = kv.merge_attention_states([identity, state] if first else [state, identity])
    np.testing.assert_array_equal(merged[0], state[0])
    np.testing.assert_array_equal(merged[1], state[1])


def test_a_single_state_is_returned_bit_for_bit():  # its weight exp(0) = 1: exact
    state = kv.attention_state(*attention_problem((3,), 2, 4))
    merged = kv.merge_attention_states([state])
    np.testing.assert_array_equal(merged[0], state[0])
    np.testing.assert_array_equal(merged[1], state[1])


@pytest.mark.parametrize("count", [1, 2, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merging_only_identities_gives_the_identity_never_nan(count, dtype):
    q, k, v = attention_problem((2,), 3, 0, dtype=dtype)
    out, lse = kv.merge_attention_states([kv.attention_state(q, k, v)] * count)
    assert out.dtype == lse.dtype == dtype and out.shape == (2, 3, 3)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert not out.any() and np.isneginf(lse).all()


def test_rows_are_merged_independently_when_only_some_are_empty():
    # Row 0 of both states has no keys; row 1 has: row 0 stays the identity, row 1 is merged.
    q, k, v = attention_problem((), 2, 6)
    a, b = kv.attention_state(q, k[:2], v[:2]), kv.attention_state(q, k[2:], v[2:])
    blank = [(out.copy(), lse.copy()) for out, lse in (a, b)]
    for out, lse in blank:
        out[0], lse[0] = 0.0, -np.inf
    out, lse = kv.merge_attention_states(blank)
    assert not out[0].any() and np.isneginf(lse[0])
    expected_out, expected_lse = naive_attention_state(q, k, v)
    np.testing.assert_allclose(out[1], expected_out[1], **TOL64)
    np.testing.assert_allclose(lse[1], expected_lse[1], **TOL64)


def test_a_state_with_lse_minus_inf_has_no_weight_whatever_its_out():
    q, k, v = attention_problem((2,), 3, 5)
    state = kv.attention_state(q, k, v)
    weightless = (np.full_like(state[0], 7.0), np.full_like(state[1], -np.inf))
    merged = kv.merge_attention_states([weightless, state])
    np.testing.assert_array_equal(merged[0], state[0])  # weights exactly 0 and 1: exact


def _random_grouping(states, rng):
    """Merge neighbouring runs of 2 or 3 states, chosen at random, until one state is left."""
    states = list(states)
    while len(states) > 1:
        size = min(len(states), int(rng.integers(2, 4)))
        start = int(rng.integers(0, len(states) - size + 1))
        states[start : start + size] = [kv.merge_attention_states(states[start : start + size])]
    return states[0]


@pytest.mark.parametrize("seed", range(8))
def test_the_merge_is_associative_and_commutative_under_random_groupings(seed):
    rng = np.random.default_rng(seed)
    q, k, v = attention_problem((2,), 3, 13, seed=seed)
    bounds = [0, *sorted(rng.integers(0, 14, size=6)), 13]  # 7 parts, some of them empty
    states = parts(q, k, v, bounds)
    flat = kv.merge_attention_states(states)
    assert_state_close(flat, naive_attention_state(q, k, v))
    assert_state_close(_random_grouping(states, rng), flat, what="grouped")
    shuffled = [states[i] for i in rng.permutation(len(states))]
    assert_state_close(kv.merge_attention_states(shuffled), flat, what="shuffled")


# --- split-KV attention: equal to attend for every split ---------------------------------------------


@pytest.mark.parametrize("t_q, s_len", ODD_SIZES)
def test_every_num_splits_from_1_to_s_plus_5_equals_attend(t_q, s_len):
    q, k, v = attention_problem((3,), t_q, s_len)
    expected = naive_attention_state(q, k, v)
    plain = attend(q, k, v)
    for num_splits in range(1, s_len + 6):
        out, lse = kv.split_kv_attention(q, k, v, num_splits=num_splits, return_lse=True)
        np.testing.assert_allclose(out, plain, err_msg=f"num_splits={num_splits}", **TOL64)
        assert_state_close((out, lse), expected, what=f"num_splits={num_splits}")


def test_one_split_is_attend_bit_for_bit():
    # Documented: one part is attend's computation, merged with weight exp(0) = 1: exact.
    q, k, v = attention_problem((2, 2), 3, 9)
    np.testing.assert_array_equal(kv.split_kv_attention(q, k, v, num_splits=1), attend(q, k, v))


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_no_keys_split_any_way_give_the_identity(num_splits):
    q, k, v = attention_problem((2,), 3, 0)
    out, lse = kv.split_kv_attention(q, k, v, num_splits=num_splits, return_lse=True)
    assert not np.isnan(out).any() and not out.any() and np.isneginf(lse).all()


@pytest.mark.parametrize("num_splits", range(1, 7))
def test_one_key_split_any_way_gives_its_value_exactly(num_splits):
    q, k, v = attention_problem((2,), 3, 1)
    out = kv.split_kv_attention(q, k, v, num_splits=num_splits)
    np.testing.assert_array_equal(out, np.broadcast_to(v, out.shape))  # weights exactly 1 and 0: exact


@pytest.mark.parametrize("s_len", range(0, 12))
def test_the_parts_are_contiguous_as_equal_as_possible_and_empty_only_when_num_splits_exceeds_s(s_len):
    for num_splits in range(1, s_len + 6):
        bounds = split_module._split_bounds(s_len, num_splits)
        sizes = np.diff(bounds)
        assert bounds[0] == 0 and bounds[-1] == s_len and len(sizes) == num_splits
        assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1
        assert (sizes == 0).sum() == max(num_splits - s_len, 0)


def test_split_kv_attends_each_part_once_with_empty_parts_between_others(monkeypatch):
    seen = []
    original = split_module._state

    def spy(q, k, v, valid=None):
        seen.append(k.shape[-2])
        return original(q, k, v, valid)

    monkeypatch.setattr(split_module, "_state", spy)
    q, k, v = attention_problem((), 1, 2)
    out = kv.split_kv_attention(q, k, v, num_splits=5)
    assert seen == [0, 0, 1, 0, 1]  # i·S // 5 for S = 2: the empty parts fall before, between and after
    # Each key alone in its part, merged by log-sum-exp: equal to one softmax up to rounding, which BLAS
    # kernels do in their own order (5.6e-17 apart under OPENBLAS_CORETYPE=Haswell): a few ULPs.
    np.testing.assert_allclose(out, attend(q, k, v), rtol=4 * np.finfo(np.float64).eps, atol=0)


@pytest.mark.parametrize("scale", [40.0, 200.0])
def test_large_logits_in_float32_match_float64_for_every_split(scale):
    q, k, v = attention_problem((2,), 3, 9, scale=scale, dtype=np.float32)
    scores = (q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2)) / math.sqrt(5)
    assert np.abs(scores).max() > 89  # exp(89) overflows float32: a softmax without the shift would give inf
    expected = naive_attention_state(q, k, v)
    for num_splits in range(1, 15):
        out, lse = kv.split_kv_attention(q, k, v, num_splits=num_splits, return_lse=True)
        assert out.dtype == lse.dtype == np.float32
        assert_state_close((out, lse), expected, TOL32, what=f"num_splits={num_splits}")


def test_large_logits_in_float64_match_for_every_split():
    q, k, v = attention_problem((2,), 3, 9, scale=400.0)
    scores = (q @ k.swapaxes(-1, -2)) / math.sqrt(5)
    assert np.abs(scores).max() > 710  # exp(710) overflows float64
    expected = naive_attention_state(q, k, v)
    plain = attend(q, k, v)
    for num_splits in range(1, 15):
        out, lse = kv.split_kv_attention(q, k, v, num_splits=num_splits, return_lse=True)
        np.testing.assert_allclose(out, plain, err_msg=f"num_splits={num_splits}", **TOL64)
        assert_state_close((out, lse), expected, what=f"num_splits={num_splits}")


# --- cascade attention: one shared prefix read once, merged with each suffix -------------------------


def cascade_problem(batch, prefix, lengths, t_q=2, seed=0):
    """q [B, T_q, 5], the shared prefix [S_p, 5] and [S_p, 3], and B suffixes [S_i, 5], [S_i, 3] as lists."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, t_q, 5))
    k_shared, v_shared = rng.standard_normal((prefix, 5)), rng.standard_normal((prefix, 3))
    k_suffix = [rng.standard_normal((n, 5)) for n in lengths]
    v_suffix = [rng.standard_normal((n, 3)) for n in lengths]
    return q, k_shared, v_shared, k_suffix, v_suffix


def concatenated_reference(q, k_shared, v_shared, k_suffix, v_suffix):
    """Each sequence over the concatenation of the prefix and its suffix, by the row-by-row reference."""
    states = [
        naive_attention_state(q[b], np.concatenate([k_shared, k_suffix[b]]), np.concatenate([v_shared, v_suffix[b]]))
        for b in range(len(q))
    ]
    return np.stack([out for out, _ in states]), np.stack([lse for _, lse in states])


def padded(arrays, width, fill):
    """B arrays [S_i, width] as [B, S_max, width], the padding filled with ``fill`` (finite garbage)."""
    s_max = max((len(a) for a in arrays), default=0)
    out = np.full((len(arrays), s_max, width), fill)
    for b, a in enumerate(arrays):
        out[b, : len(a)] = a
    return out


@pytest.mark.parametrize("batch", [1, 2, 5])
@pytest.mark.parametrize("prefix", [0, 1, 7, 16])
@pytest.mark.parametrize("form", ["list", "padded"])
def test_cascade_equals_attending_over_each_concatenation(batch, prefix, form):
    lengths = np.random.default_rng(batch * 31 + prefix).integers(0, 6, size=batch).tolist()
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_problem(batch, prefix, lengths)
    expected = concatenated_reference(q, k_shared, v_shared, k_suffix, v_suffix)
    if form == "list":
        state = kv.cascade_attention(q, k_shared, v_shared, k_suffix, v_suffix, return_lse=True)
    else:
        k_pad, v_pad = padded(k_suffix, 5, 3.0), padded(v_suffix, 3, -9.0)  # padding gets weight exactly 0
        state = kv.cascade_attention(q, k_shared, v_shared, k_pad, v_pad, suffix_lengths=lengths, return_lse=True)
    assert state[0].shape == (batch, 2, 3)
    assert_state_close(state, expected, what=f"lengths {lengths}")


@pytest.mark.parametrize("fill", [1e308, np.nan, np.inf])
def test_cascade_padding_past_the_lengths_may_hold_anything_as_masked_attend_takes_it(fill):
    # Padding is masked out: huge keys do not enter the overflow bound, and NaN/inf do not matter, as in masked_attend.
    lengths = [2, 0, 3]
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_problem(3, 4, lengths)
    k_pad, v_pad = padded(k_suffix, 5, fill), padded(v_suffix, 3, fill)
    with np.errstate(all="raise"):
        state = kv.cascade_attention(q, k_shared, v_shared, k_pad, v_pad, suffix_lengths=lengths, return_lse=True)
    assert_state_close(state, concatenated_reference(q, k_shared, v_shared, k_suffix, v_suffix))
    valid = np.arange(3) < np.array(lengths)[:, None]  # [B, S_max]
    k_all = np.concatenate([np.broadcast_to(k_shared, (3, 4, 5)), k_pad], axis=1)  # [B, S_p + S_max, D_k]
    v_all = np.concatenate([np.broadcast_to(v_shared, (3, 4, 3)), v_pad], axis=1)
    valid_all = np.concatenate([np.ones((3, 4), dtype=bool), valid], axis=1)
    np.testing.assert_allclose(kv.masked_attend(q, k_all, v_all, valid_all), state[0], **TOL64)  # both accept it
    k_pad[2, 1, 0] = fill if not np.isfinite(fill) else np.nan  # within a length: refused, naming k_suffix
    with pytest.raises(ValueError, match=r"^k_suffix contains NaN or inf within suffix_lengths$"):
        kv.cascade_attention(q, k_shared, v_shared, k_pad, v_pad, suffix_lengths=lengths)


def test_cascade_with_equal_suffixes_as_arrays_and_no_lengths():
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_problem(4, 9, [3] * 4, t_q=1)
    out = kv.cascade_attention(q, k_shared, v_shared, np.stack(k_suffix), np.stack(v_suffix))
    np.testing.assert_allclose(out, concatenated_reference(q, k_shared, v_shared, k_suffix, v_suffix)[0], **TOL64)


def test_cascade_with_no_prefix_and_no_suffix_gives_zeros_and_minus_inf():
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_problem(3, 0, [0, 2, 0])
    out, lse = kv.cascade_attention(q, k_shared, v_shared, k_suffix, v_suffix, return_lse=True)
    assert not out[[0, 2]].any() and np.isneginf(lse[[0, 2]]).all() and np.isfinite(lse[1]).all()


def test_cascade_reads_the_prefix_in_one_product_for_all_sequences(monkeypatch):
    calls = []
    original = split_module._state

    def spy(q, k, v, valid=None):
        calls.append((q.shape, k.shape))
        return original(q, k, v, valid)

    monkeypatch.setattr(split_module, "_state", spy)
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_problem(6, 10, [1, 2, 3, 4, 5, 6], t_q=2)
    kv.cascade_attention(q, k_shared, v_shared, k_suffix, v_suffix)
    prefix_calls = [call for call in calls if call[1][-2] == 10]
    assert prefix_calls == [((12, 5), (10, 5))]  # all B·T_q = 12 query rows against the prefix, once
    assert len(calls) == 2  # and one batched call for the six suffixes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cascade_keeps_float32_and_matches_float64(dtype):
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_problem(3, 8, [2, 0, 5])
    cast = [a.astype(dtype) for a in (q, k_shared, v_shared)]
    out = kv.cascade_attention(*cast, [a.astype(dtype) for a in k_suffix], [a.astype(dtype) for a in v_suffix])
    assert out.dtype == dtype
    expected = concatenated_reference(*cast, [a.astype(dtype) for a in k_suffix], [a.astype(dtype) for a in v_suffix])
    np.testing.assert_allclose(out, expected[0], **(TOL64 if dtype == np.float64 else TOL32))


# --- the decode: multi_head_decode(num_splits=...) on a cache ----------------------------------------


@pytest.mark.parametrize("path", HEADS_PATHS)
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 12])
def test_split_kv_decode_matches_the_reference(path, batch, num_splits):
    args = heads_problem(9, batch)
    out = heads_decode(*args, path=path, num_splits=num_splits)
    np.testing.assert_allclose(out, naive_multi_head(*args, 6, 2), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path", HEADS_PATHS)
def test_one_split_decode_is_the_unsplit_decode_bit_for_bit(path):
    # Documented: each step's one part is attend's computation, merged with weight exp(0) = 1: exact.
    args = heads_problem(7, 3)
    np.testing.assert_array_equal(heads_decode(*args, path=path, num_splits=1), heads_decode(*args, path=path))


@pytest.mark.parametrize("path", HEADS_PATHS)
def test_split_kv_decode_continues_a_prefilled_cache(path):
    x, *weights = heads_problem(10, 3)
    cache = kv.StaticCache((3, 2), 10, 3, 3)
    heads_decode(x[:, :4], *weights, path=path, cache=cache)  # a prefill of 4 positions
    out = heads_decode(x[:, 4:], *weights, path=path, cache=cache, num_splits=3)
    assert cache.get_seq_length() == 10
    np.testing.assert_allclose(out, naive_multi_head(x, *weights, 6, 2)[:, 4:], rtol=1e-10, atol=1e-10)


def test_split_kv_decode_in_float32():
    args32 = heads_problem(11, 3, dtype=np.float32)
    out = heads_decode(*args32, num_splits=4)
    assert out.dtype == np.float32
    expected = naive_multi_head(*(a.astype(np.float64) for a in args32), 6, 2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


# --- bad input: a clear error, nothing changed --------------------------------------------------------


BAD_NUM_SPLITS = [
    (0, ValueError, r"num_splits must be >= 1, got 0"),
    (-3, ValueError, r"num_splits must be >= 1, got -3"),
    (1.5, TypeError, r"num_splits must be an integer, got 1.5"),
    (2.0, TypeError, r"num_splits must be an integer, got 2.0"),
    (True, TypeError, r"num_splits must be an integer, got True"),
    ("2", TypeError, r"num_splits must be an integer, got '2'"),
]


@pytest.mark.parametrize("num_splits, error, message", BAD_NUM_SPLITS + [(None, TypeError, "got None")])
def test_num_splits_must_be_a_positive_integer(num_splits, error, message):
    with pytest.raises(error, match=message):
        kv.split_kv_attention(*attention_problem((), 1, 3), num_splits=num_splits)


@pytest.mark.parametrize("num_splits, error, message", BAD_NUM_SPLITS)
def test_a_decode_with_a_bad_num_splits_changes_no_cache(num_splits, error, message):
    cache = kv.StaticCache((3, 2), 8, 3, 3)
    with pytest.raises(error, match=message):
        heads_decode(*heads_problem(4), cache=cache, num_splits=num_splits)
    assert cache.get_seq_length() == 0 and cache.k_cache is None  # built without a dtype: not even allocated


def test_split_kv_attention_needs_num_splits_by_keyword():
    with pytest.raises(TypeError):
        kv.split_kv_attention(*attention_problem((), 1, 3), 2)


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((3,), (4, 5), (4, 3)), r"q, k and v must be \[\.\.\., T_q, D_k\].* got q \(3,\), k \(4, 5\), v \(4, 3\)"),
        (((2, 5), (2, 4, 5), (2, 4, 3)), r"the same leading axes, got q \(2, 5\), k \(2, 4, 5\)"),
        (((2, 1, 5), (3, 4, 5), (3, 4, 3)), r"the same leading axes, got q \(2, 1, 5\), k \(3, 4, 5\)"),
        (((1, 5), (4, 6), (4, 3)), r"q and k must share D_k, and k and v the S axis: q \(1, 5\), k \(4, 6\)"),
        (((1, 5), (4, 5), (3, 3)), r"k and v the S axis: q \(1, 5\), k \(4, 5\), v \(3, 3\)"),
        (((1, 0), (4, 0), (4, 3)), r"D_k must be at least 1"),
    ],
)
@pytest.mark.parametrize("function", ["attention_state", "split_kv_attention"])
def test_shapes_that_do_not_fit_are_named(function, shapes, message):
    q, k, v = (np.ones(shape) for shape in shapes)
    call = getattr(kv, function)
    with pytest.raises(ValueError, match=message):
        call(q, k, v) if function == "attention_state" else call(q, k, v, num_splits=2)


@pytest.mark.parametrize("position, name", [(0, "q"), (1, "k"), (2, "v")])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_inputs_name_the_argument(position, name, bad):
    args = [a.copy() for a in attention_problem((2,), 2, 4)]
    args[position][0, 0, 0] = bad
    with pytest.raises(ValueError, match=rf"^{name} contains NaN or inf$"):
        kv.attention_state(*args)
    with pytest.raises(ValueError, match=rf"^{name} contains NaN or inf$"):
        kv.split_kv_attention(*args, num_splits=3)


def test_integer_inputs_are_a_type_error():
    q, k, v = attention_problem((), 2, 4)
    with pytest.raises(TypeError, match=r"k must be a float32, float64, bfloat16 or float16 array, got dtype int64"):
        kv.attention_state(q, k.astype(np.int64), v)


def _state(t_q=3, d_v=2):
    return np.zeros((t_q, d_v)), np.zeros(t_q)


@pytest.mark.parametrize(
    "states, error, message",
    [
        ([], ValueError, r"states must hold at least one \(out, lse\) pair"),
        (5, TypeError, r"states must be a sequence of \(out, lse\) pairs, got int"),
        (np.zeros((2, 3, 2)), TypeError, r"got ndarray"),
        ([np.zeros((3, 2))], TypeError, r"states\[0\] must be an \(out, lse\) pair, got ndarray"),
        ([_state(), (np.zeros((3, 2)),)], TypeError, r"states\[1\] must be an \(out, lse\) pair"),
        ([(np.zeros((3, 2)), np.zeros(2))], ValueError, r"states\[0\] must be out \[\.\.\., T_q, D_v\] and lse"),
        ([(np.zeros(3), np.zeros(()))], ValueError, r"states\[0\] must be out"),
        ([_state(), _state(d_v=3)], ValueError, r"every state must have the shape of states\[0\]: out \(3, 2\)"),
        ([_state(), (np.zeros((3, 2)), np.array([0.0, np.nan, 0.0]))], ValueError, r"states\[1\] lse contains NaN"),
        ([(np.zeros((3, 2)), np.array([0.0, np.inf, 0.0]))], ValueError, r"\+inf.*PR #978"),
        ([_state(), (np.full((3, 2), np.nan), np.zeros(3))], ValueError, r"^states\[1\] out contains NaN or inf$"),
        ([(np.zeros((3, 2), np.int32), np.zeros(3))], TypeError, r"states\[0\] out must be a float32 or float64"),
        ([(np.zeros((3, 2)), np.zeros(3, np.int64))], TypeError, r"states\[0\] lse must be a float32 or float64"),
    ],
)
def test_bad_states_are_refused(states, error, message):
    with pytest.raises(error, match=message):
        kv.merge_attention_states(states)


def test_states_may_come_from_a_generator_and_mixed_dtypes_promote():
    q, k, v = attention_problem((), 2, 6)
    states = (kv.attention_state(q.astype(np.float32), k[a:b], v[a:b]) for a, b in ((0, 3), (3, 6)))
    out, lse = kv.merge_attention_states(states)
    assert out.dtype == np.float64
    assert_state_close((out, lse), naive_attention_state(q.astype(np.float32), k, v))


def _cascade_args(**changes):
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_problem(3, 4, [2, 0, 1])
    args = dict(q=q, k_shared=k_shared, v_shared=v_shared, k_suffix=k_suffix, v_suffix=v_suffix)
    args.update(changes)
    return args


@pytest.mark.parametrize(
    "changes, error, message",
    [
        (dict(q=np.ones((2, 5))), ValueError, r"q must be \[B, T_q, D_k\] with D_k >= 1, got shape \(2, 5\)"),
        (dict(k_shared=np.ones((4, 6))), ValueError, r"k_shared and v_shared must be \[S_p, D_k=5\]"),
        (dict(v_shared=np.ones((3, 3))), ValueError, r"got k_shared \(4, 5\), v_shared \(3, 3\)"),
        (dict(k_suffix=[np.ones((2, 5))] * 2), ValueError, r"k_suffix has 2 suffixes but v_suffix has 3"),
        (dict(k_suffix=[np.ones((2, 5))] * 2, v_suffix=[np.ones((2, 3))] * 2), ValueError,
         r"q has B=3 sequences but there are 2 suffixes"),
        (dict(k_suffix=[np.ones((2, 4)), np.ones((0, 5)), np.ones((1, 5))]), ValueError,
         r"k_suffix\[0\] and v_suffix\[0\] must be \[S_i, D_k=5\] and \[S_i, D_v=3\], got \(2, 4\) and \(2, 3\)"),
        (dict(k_suffix=[np.ones((2, 5)), np.ones((1, 5)), np.ones((1, 5))]), ValueError, r"k_suffix\[1\] and"),
        (dict(k_suffix=np.ones((3, 2, 5))), TypeError,
         r"must both be lists of B arrays \[S_i, D\] or both arrays \[B, S_max, D\], got ndarray and list"),
        (dict(k_suffix=np.ones((3, 2, 5)), v_suffix=np.ones((3, 3, 3))), ValueError,
         r"k_suffix and v_suffix must be \[B, S_max, D_k=5\] and \[B, S_max, D_v=3\]"),
        (dict(suffix_lengths=[2, 0, 1]), ValueError, r"suffix_lengths is for padded suffixes"),
        (dict(k_suffix=np.ones((3, 2, 5)), v_suffix=np.ones((3, 2, 3)), suffix_lengths=[2, 3, 0]), ValueError,
         r"suffix_lengths must be at most S_max=2, got \[2, 3, 0\]"),
        (dict(k_suffix=np.ones((3, 2, 5)), v_suffix=np.ones((3, 2, 3)), suffix_lengths=[2, -1, 0]), ValueError,
         r"suffix_lengths\[1\] must be >= 0"),
        (dict(k_suffix=np.ones((3, 2, 5)), v_suffix=np.ones((3, 2, 3)), suffix_lengths=[2, 1]), ValueError,
         r"suffix_lengths must be 3 integers"),
        (dict(k_suffix=[np.ones((2, 5)), np.full((0, 5), 1.0), np.array([[np.nan] * 5])]), ValueError,
         r"^k_suffix\[2\] contains NaN or inf$"),
        (dict(v_shared=np.full((4, 3), np.inf)), ValueError, r"^v_shared contains NaN or inf$"),
    ],
)
def test_bad_cascade_inputs_are_refused(changes, error, message):
    with pytest.raises(error, match=message):
        kv.cascade_attention(**_cascade_args(**changes))


# --- random shapes, split counts, partitions and scales -----------------------------------------------


@st.composite
def attention_problems(draw):
    """(q, k, v) of random leading axes, T_q, S, D_k, D_v, seed and query scale (scores up to about 1e3)."""
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    t_q, s_len = draw(st.integers(0, 4)), draw(st.integers(0, 12))
    d_k, d_v = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    scale = draw(st.floats(1e-3, 1e2))
    return attention_problem(lead, t_q, s_len, d_k, d_v, seed=draw(st.integers(0, 2**32 - 1)), scale=scale)


@settings(max_examples=80, deadline=None)
@given(problem=attention_problems(), data=st.data())
def test_random_shapes_splits_and_scales_match_the_reference(problem, data):
    q, k, v = problem
    num_splits = data.draw(st.integers(1, k.shape[-2] + 5), label="num_splits")
    state = kv.split_kv_attention(q, k, v, num_splits=num_splits, return_lse=True)
    assert_state_close(state, naive_attention_state(q, k, v), TOL64)


@settings(max_examples=60, deadline=None)
@given(problem=attention_problems(), data=st.data())
def test_random_partitions_merge_to_the_state_of_all_keys(problem, data):
    q, k, v = problem
    s_len = k.shape[-2]
    cuts = data.draw(st.lists(st.integers(0, s_len), max_size=6), label="cuts")
    states = parts(q, k, v, [0, *sorted(cuts), s_len])
    assert_state_close(kv.merge_attention_states(states), naive_attention_state(q, k, v), TOL64)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 4), prefix=st.integers(0, 9), t_q=st.integers(1, 3),
    lengths=st.lists(st.integers(0, 5), min_size=4, max_size=4), seed=st.integers(0, 2**32 - 1),
)
def test_random_cascades_match_the_concatenation(batch, prefix, t_q, lengths, seed):
    args = cascade_problem(batch, prefix, lengths[:batch], t_q=t_q, seed=seed)
    state = kv.cascade_attention(*args, return_lse=True)
    assert_state_close(state, concatenated_reference(*args))


@pytest.mark.parametrize("flag", ["no", 1, None, np.array([True])])
def test_return_lse_must_be_true_or_false(flag):
    q, k, v = np.ones((1, 2)), np.ones((3, 2)), np.ones((3, 2))
    with pytest.raises(TypeError, match="^return_lse must be True or False, got "):
        kv.split_kv_attention(q, k, v, num_splits=2, return_lse=flag)
    with pytest.raises(TypeError, match="^return_lse must be True or False, got "):
        kv.cascade_attention(q[None], k, v, [k], [v], return_lse=flag)
    out, lse = kv.split_kv_attention(q, k, v, num_splits=2, return_lse=np.True_)
    np.testing.assert_allclose(out, v[:1])  # equal keys: the mean of the values
    np.testing.assert_allclose(lse, [np.log(3) + 2 / np.sqrt(2)])  # log(3 · exp(q·k / sqrt(2)))
