"""The split-KV and cascade benchmarks' own machinery: their oracles, their checks, and skips for what a commit lacks."""

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import bench_split
from kv_attention import split as split_module

from ..references import naive_attention, naive_multi_head


def test_split_oracle_matches_the_independent_per_head_reference():
    x, w_q, w_k, w_v, w_o = (a[0] if a.ndim == 3 else a for a in bench_split.heads_inputs("gqa", 9))
    np.testing.assert_allclose(
        bench_split.split_oracle(x, w_q, w_k, w_v, w_o, 4), naive_multi_head(x, w_q, w_k, w_v, w_o, 8, 2)[4:],
        rtol=1e-10, atol=1e-10,
    )


def test_cascade_oracle_matches_the_independent_reference():
    q, k, v = bench_split.concatenated_inputs()
    expected = np.stack([naive_attention(q[b], k[b], v[b]) for b in range(len(q))])
    np.testing.assert_allclose(bench_split.cascade_oracle(q, k, v), expected, rtol=1e-10, atol=1e-10)


def test_the_timed_inputs_have_the_issues_shapes_and_are_read_only():
    x, w_q, w_k, w_v, w_o = bench_split.split_inputs()
    assert x.shape == (2048, 128) and w_k.shape == (128, 32)
    np.testing.assert_array_equal(x, bench_split.heads_inputs("gqa", 2048)[0][0])
    q, k_shared, v_shared, k_suffix, v_suffix = bench_split.cascade_inputs()
    assert [a.shape for a in (q, k_shared, v_shared, k_suffix, v_suffix)] == [
        (8, 1, 64), (1024, 64), (1024, 64), (8, 64, 64), (8, 64, 64)]
    _, k, v = bench_split.concatenated_inputs()
    assert k.shape == v.shape == (8, 1088, 64)
    for b in range(8):  # every sequence's own copy: the shared prefix, then its suffix
        np.testing.assert_array_equal(k[b], np.concatenate([k_shared, k_suffix[b]]))
        np.testing.assert_array_equal(v[b], np.concatenate([v_shared, v_suffix[b]]))
    arrays = (x, w_q, q, k_shared, v_shared, k_suffix, v_suffix, k, v)
    assert not any(a.flags.writeable for a in arrays)


def test_the_prefilled_cache_holds_the_first_2032_positions():
    cache = bench_split.prefilled_cache()
    assert cache.get_seq_length() == 2032 and cache.k_cache.shape == (2, 2048, 16)
    x, _, w_k, _, _ = bench_split.split_inputs()
    np.testing.assert_allclose(cache.k_cache[1, 5], x[5] @ w_k[:, 16:32], rtol=1e-12)  # K/V head 1, position 5
    assert not cache.k_cache[:, 2032:].any()


@pytest.mark.parametrize("num_splits", bench_split.NUM_SPLITS)
def test_check_passes_the_correct_decode_and_the_timed_call_can_repeat(one_thread, num_splits):
    benchmark = bench_split.SplitDecode()
    benchmark.setup(num_splits)
    assert benchmark.decode.func is kv.multi_head_decode
    assert benchmark.decode.keywords.get("num_splits") == num_splits
    for _ in range(2):  # the timed call crops the cache back to the prefill
        benchmark.time_decode(num_splits)
        assert benchmark.cache.get_seq_length() == 2032


def test_check_fails_a_merge_without_the_log_sum_exp_weights(one_thread, monkeypatch):
    def averaged(outs, lses):  # each part weighed alike: what a merge that ignores the lse gives
        return np.mean(outs, axis=0), np.max(lses, axis=0)

    monkeypatch.setattr(split_module, "_merge", averaged)
    bench_split.verified_split_decode(1)  # one part: the wrong merge cannot show
    with pytest.raises(AssertionError, match="num_splits=4, last 16 of T=2048"):
        bench_split.verified_split_decode(4)
    with pytest.raises(AssertionError, match="cascade, B=8"):
        bench_split.verified_cascade("cascade")


def test_check_fails_a_decode_that_ignores_the_prefilled_cache(one_thread, monkeypatch):
    original = kv.multi_head_decode

    def fresh_cache(*args, cache=None, **options):
        return original(*args, **options)

    monkeypatch.setattr(kv, "multi_head_decode", fresh_cache)
    with pytest.raises(AssertionError, match="num_splits=None"):
        bench_split.verified_split_decode(None)


def test_checks_skip_what_the_commit_lacks(one_thread, monkeypatch):
    def without_num_splits(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, path="grouped", cache=None):
        raise AssertionError("not reached")

    monkeypatch.setattr(kv, "multi_head_decode", without_num_splits)
    with pytest.raises(NotImplementedError, match="multi_head_decode has no num_splits"):
        bench_split.verified_split_decode(4)
    monkeypatch.delattr(kv, "cascade_attention")
    monkeypatch.delattr(kv, "attention_state")
    with pytest.raises(NotImplementedError, match="no cascade_attention"):
        bench_split.verified_cascade("cascade")
    with pytest.raises(NotImplementedError, match="no attention_state"):
        bench_split.verified_cascade("concatenated")


@pytest.mark.parametrize("strategy", bench_split.CASCADE_STRATEGIES)
def test_cascade_check_passes_both_strategies(one_thread, strategy):
    benchmark = bench_split.CascadeAttention()
    benchmark.setup(strategy)
    benchmark.time_attention(strategy)


def test_key_bytes_read():
    assert bench_split.key_bytes_read("concatenated") == 8 * 1088 * 64 * 8
    assert bench_split.key_bytes_read("cascade") == (1024 + 8 * 64) * 64 * 8
