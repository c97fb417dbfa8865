"""The ragged benchmarks' inputs, oracle, correctness check, skips and reported counts."""

import math

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import bench_ragged, common
from benchmarks.common import STRATEGIES
from benchmarks.bench_ragged import RaggedDecode

from ..references import blocks_per_step, naive_causal_attention


def test_length_distributions_are_the_issues():
    lengths = bench_ragged.LENGTH_DISTRIBUTIONS
    assert lengths["equal"] == [256] * 8
    assert lengths["skewed"] == [256] + [16] * 7
    uniform = lengths["uniform"]
    assert len(uniform) == 8 and uniform[0] == 16 and uniform[-1] == 256
    assert all(abs(n - (16 + b * 240 / 7)) <= 0.5 for b, n in enumerate(uniform))


def test_inputs_are_read_only_prefixes_of_the_timed_problem():
    seqs, w_q, w_k, w_v = bench_ragged.ragged_inputs("uniform")
    x = np.random.default_rng(42).standard_normal((8, 256, 64))
    assert [len(s) for s in seqs] == bench_ragged.LENGTH_DISTRIBUTIONS["uniform"]
    for b, seq in enumerate(seqs):
        np.testing.assert_array_equal(seq, x[b, : len(seq)])
    assert not any(a.flags.writeable for a in (*seqs, w_q, w_k, w_v))


def test_ragged_oracle_matches_the_independent_reference():
    x, w_q, w_k, w_v = common.timed_inputs(9, 2)
    expected = [naive_causal_attention(x[0, :9], w_q, w_k, w_v), naive_causal_attention(x[1, :4], w_q, w_k, w_v)]
    for got, want in zip(bench_ragged.ragged_oracle([x[0, :9], x[1, :4]], w_q, w_k, w_v), expected):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("distribution", sorted(bench_ragged.LENGTH_DISTRIBUTIONS))
@pytest.mark.parametrize("strategy", list(STRATEGIES["ragged"]))
def test_check_passes_every_strategy_on_every_distribution(one_thread, strategy, distribution):
    decode = bench_ragged.verified_ragged_decode(strategy, distribution)
    assert decode.func is kv.ragged_decode and decode.keywords["strategy"] == strategy
    if strategy == "paged":
        assert decode.keywords["block_size"] == 16
        assert decode.keywords["num_blocks"] == bench_ragged.pool_blocks(distribution)
    else:  # no pool: neither option, which the library refuses for these strategies
        assert "block_size" not in decode.keywords and "num_blocks" not in decode.keywords


def test_check_fails_a_decode_that_is_0_1_percent_off_in_one_sequence(one_thread, monkeypatch):
    real = kv.ragged_decode

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        out[3] = out[3] * 1.001
        return out

    monkeypatch.setattr(kv, "ragged_decode", wrong)
    with pytest.raises(AssertionError, match="compacted, skewed, sequence 3"):
        bench_ragged.verified_ragged_decode("compacted", "skewed")


def test_check_skips_what_the_commit_lacks(one_thread, monkeypatch):
    monkeypatch.setattr(kv, "RAGGED_STRATEGIES", ("padded", "compacted"))
    with pytest.raises(NotImplementedError, match="no ragged strategy 'paged'"):
        bench_ragged.verified_ragged_decode("paged", "equal")
    monkeypatch.delattr(kv, "ragged_decode")
    with pytest.raises(NotImplementedError, match="no ragged_decode"):
        bench_ragged.verified_ragged_decode("padded", "equal")


def test_counts_are_skipped_when_the_decode_cannot_report_them():
    def old_ragged_decode(x, w_q, w_k, w_v, *, strategy="compacted"):
        raise AssertionError("not called")

    with pytest.raises(NotImplementedError, match="no return_stats"):
        bench_ragged.ragged_stats(old_ragged_decode, ())


@pytest.mark.parametrize("distribution", sorted(bench_ragged.LENGTH_DISTRIBUTIONS))
@pytest.mark.parametrize("strategy", list(STRATEGIES["ragged"]))
def test_tracked_counts_are_the_issues_figures(one_thread, strategy, distribution):
    lengths = bench_ragged.LENGTH_DISTRIBUTIONS[distribution]
    class OnePoint(RaggedDecode):
        params = [[strategy], [distribution]]

    checked = OnePoint().setup_cache()
    bench = OnePoint()
    bench.setup(checked, strategy, distribution)
    reserved = bench.track_reserved_slots(checked, strategy, distribution)
    row_steps = bench.track_row_steps(checked, strategy, distribution)
    if strategy == "paged":
        assert reserved == 16 * max(blocks_per_step(lengths, None, 16))
        assert reserved <= 16 * sum(math.ceil(n / 16) for n in lengths)
    else:
        assert reserved == 8 * 256
    assert row_steps == (8 * 256 if strategy == "padded" else sum(lengths))


def test_a_commit_without_return_stats_is_timed_and_its_counts_skip(one_thread, monkeypatch):
    right = kv.ragged_decode

    def old_ragged_decode(seqs, w_q, w_k, w_v, *, strategy, block_size=16, num_blocks=None):  # accepted, unused
        return right(seqs, w_q, w_k, w_v, strategy=strategy)

    monkeypatch.setattr(kv, "ragged_decode", old_ragged_decode)

    class OnePoint(RaggedDecode):
        params = [["compacted"], ["skewed"]]

    checked = OnePoint().setup_cache()
    assert checked[("compacted", "skewed")] == {"value": None, "verified": ["compacted, skewed"]}
    bench = OnePoint()
    bench.setup(checked, "compacted", "skewed")
    bench.time_decode(checked, "compacted", "skewed")
    from asv_runner.benchmarks.mark import SkipNotImplemented

    with pytest.raises(SkipNotImplemented, match="no return_stats"):  # asv skips, as it would not a plain one
        bench.track_row_steps(checked, "compacted", "skewed")


def test_the_paged_step_points_are_the_issues_and_their_sides_agree(one_thread):
    assert bench_ragged.PAGED_STEP == {"gather_2048": ("gather", 2048), "padded_8192": ("padded", 8192)}
    q, ks, vs = bench_ragged.paged_step_inputs(2048)
    assert q.dtype == np.float32 and [len(k) for k in ks] == [2048] + [64] * 7 and ks[0].shape[1] == 64
    steps = bench_ragged.paged_step_sides(2048)
    expected = bench_ragged.paged_step_reference(q, ks, vs)
    for step in steps.values():
        np.testing.assert_allclose(step(), expected, rtol=1e-4, atol=1e-5)


def test_a_wrong_paged_step_fails_its_check(one_thread, monkeypatch):
    real = kv.paged_attention
    monkeypatch.setattr(kv, "paged_attention", lambda *args, **kwargs: real(*args, **kwargs) * 1.001)
    bench_ragged.paged_step_sides.cache_clear()
    try:
        with pytest.raises(AssertionError, match="paged, 1 x 2048 \\+ 7 x 64"):
            bench_ragged.paged_step_sides(2048)
    finally:
        bench_ragged.paged_step_sides.cache_clear()
