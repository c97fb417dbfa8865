"""``check_finite`` on every public entry point that takes arrays: False skips the scans, and nothing else.

On finite input False gives the default's result (the same computation, so bit for
bit) and the independent reference's; NaN input is refused by the default and
passes unchecked with False, reaching the output as NaN.
"""

import numpy as np
import pytest

import kv_attention as kv

from ..references import attention_problem, heads_problem, naive_attend, naive_causal_attention, naive_multi_head, problem


def with_nan(arrays, index=0):
    """``arrays`` with a NaN in the first element of ``arrays[index]`` (a copy)."""
    arrays = [a.copy() for a in arrays]
    arrays[index].flat[0] = np.nan
    return arrays


def attention_inputs():
    return attention_problem((2,), 3, 6)


def projection_inputs(batch=None):
    return problem(5, batch)


def cascade_inputs():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 1, 4))
    k_shared, v_shared = rng.standard_normal((3, 4)), rng.standard_normal((3, 5))
    k_suffix, v_suffix = rng.standard_normal((2, 2, 4)), rng.standard_normal((2, 2, 5))
    return q, k_shared, v_shared, k_suffix, v_suffix


def state_inputs():
    """``[out_0, lse_0, out_1, lse_1]``: the states of :func:`attention_inputs` over keys 0..1 and 2..5."""
    q, k, v = attention_inputs()
    return [*kv.attention_state(q, k[..., :2, :], v[..., :2, :]), *kv.attention_state(q, k[..., 2:, :], v[..., 2:, :])]


def merged(arrays, **options):
    out_0, lse_0, out_1, lse_1 = arrays
    return kv.merge_attention_states([(out_0, lse_0), (out_1, lse_1)], **options)[0]


HEADS = {"n_heads": 6, "n_kv_heads": 2}


def paged(arrays, **options):
    """``paged_attention`` of q over k, v stored in a pool of blocks of 4 (two sequences of 6 positions)."""
    q, k, v = arrays
    cache = kv.PagedKVCache(4, 4, k.shape[-1], v.shape[-1])
    for seq_id in (0, 1):
        cache.add_sequence(seq_id)
    cache.update([0, 1], k, v)
    return kv.paged_attention(q, cache, [0, 1], **options)

# name -> (inputs, call(inputs, **check_finite), the reference of its output on finite inputs or None).
# The NaN goes into inputs[0] (q, or a state's out) for attention steps, into w_q (inputs[1]) for the decodes,
# so that a cache's own update, which checks what is written to it, is given finite keys and values.
ENTRY_POINTS = {
    "attend": (attention_inputs, lambda a, **o: kv.attend(*a, **o), lambda a: naive_attend(*a)),
    "masked_attend": (attention_inputs, lambda a, **o: kv.masked_attend(*a, np.ones((2, 6), bool), **o),
                      lambda a: naive_attend(*a)),
    "attention_state": (attention_inputs, lambda a, **o: kv.attention_state(*a, **o)[0], lambda a: naive_attend(*a)),
    "paged_attention": (attention_inputs, paged, lambda a: naive_attend(*a)),
    "merge_attention_states": (state_inputs, merged, lambda a: naive_attend(*attention_inputs())),
    "split_kv_attention": (attention_inputs, lambda a, **o: kv.split_kv_attention(*a, num_splits=2, **o),
                           lambda a: naive_attend(*a)),
    "cascade_attention": (cascade_inputs, lambda a, **o: kv.cascade_attention(*a, **o), None),
    "causal_attention": (projection_inputs, lambda a, **o: kv.causal_attention(*a, **o),
                         lambda a: naive_causal_attention(*a)),
    "decode_without_cache": (projection_inputs, lambda a, **o: kv.decode_without_cache(*a, **o),
                             lambda a: naive_causal_attention(*a)),
    "cached_attention": (projection_inputs, lambda a, **o: kv.cached_attention(*a, **o),
                         lambda a: naive_causal_attention(*a)),
    "cached_attention_preallocated": (projection_inputs, lambda a, **o: kv.cached_attention_preallocated(*a, **o),
                                      lambda a: naive_causal_attention(*a)),
    "sequential_cached_attention": (lambda: projection_inputs(2),
                                    lambda a, **o: kv.sequential_cached_attention(*a, **o),
                                    lambda a: naive_causal_attention(*a)),
    "batched_cached_attention": (lambda: projection_inputs(2), lambda a, **o: kv.batched_cached_attention(*a, **o),
                                 lambda a: naive_causal_attention(*a)),
    "chunked_attention": (projection_inputs, lambda a, **o: kv.chunked_attention(*a, chunk_size=2, **o),
                          lambda a: naive_causal_attention(*a)),
    "multi_head_attention": (lambda: heads_problem(4), lambda a, **o: kv.multi_head_attention(*a, **HEADS, **o),
                             lambda a: naive_multi_head(*a, 6, 2)),
    "multi_head_decode": (lambda: heads_problem(4), lambda a, **o: kv.multi_head_decode(*a, **HEADS, **o),
                          lambda a: naive_multi_head(*a, 6, 2)),
    "multi_head_decode, repeat_kv, split": (
        lambda: heads_problem(4),
        lambda a, **o: kv.multi_head_decode(*a, **HEADS, path="repeat_kv", num_splits=2, **o),
        lambda a: naive_multi_head(*a, 6, 2)),
}


ATTENTION_STEPS = ("attend", "masked_attend", "attention_state", "paged_attention", "merge_attention_states", "split_kv_attention",
                   "cascade_attention")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_check_finite_false_gives_the_default_result_on_finite_input(name):
    inputs, call, reference = ENTRY_POINTS[name]
    args = inputs()
    unchecked = call(args, check_finite=False)
    np.testing.assert_array_equal(unchecked, call(args))  # the same computation: bit for bit
    if reference is not None:
        np.testing.assert_allclose(unchecked, reference(args), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_nan_input_raises_by_default_and_passes_unchecked_with_check_finite_false(name):
    inputs, call, _ = ENTRY_POINTS[name]
    args = with_nan(inputs(), 0 if name in ATTENTION_STEPS else 1)
    with pytest.raises(ValueError, match="contains NaN or inf"):
        call(args, check_finite=True)
    with np.errstate(invalid="ignore"):
        out = call(args, check_finite=False)
    assert np.isnan(out).any()


def test_a_masked_nan_key_is_taken_as_zero_only_when_checked():
    q, k, v = attention_inputs()
    valid = np.ones((2, 6), bool)
    valid[:, 0] = False
    k_bad = k.copy()
    k_bad[:, 0] = np.nan
    np.testing.assert_allclose(kv.masked_attend(q, k_bad, v, valid), naive_attend(q, k, v, valid), rtol=1e-12,
                               atol=1e-12)
    with np.errstate(invalid="ignore"):
        out = kv.masked_attend(q, k, v, valid, check_finite=False)  # finite: the same as checked
    np.testing.assert_array_equal(out, kv.masked_attend(q, k, v, valid))


@pytest.mark.parametrize("flag", ["no", 1, None])
def test_check_finite_must_be_true_or_false(flag):
    q, k, v = attention_inputs()
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        kv.attend(q, k, v, check_finite=flag)
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        kv.multi_head_decode(*heads_problem(2), **HEADS, check_finite=flag)


def test_a_masked_nan_value_is_taken_as_zero_by_attention_state_as_by_masked_attend():
    q, k, v = attention_inputs()
    valid = np.ones((2, 6), bool)
    valid[:, 0] = False
    v_bad = v.copy()
    v_bad[:, 0] = np.nan
    out, lse = kv.attention_state(q, k, v_bad, valid=valid)
    np.testing.assert_allclose(out, naive_attend(q, k, v, valid), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, kv.masked_attend(q, k, v_bad, valid), rtol=1e-12, atol=1e-12)
