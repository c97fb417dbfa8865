"""ragged_decode: every sequence equals its solo decode, at every step, whatever joins and leaves."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv
from kv_attention import masked_attend

from ..references import blocks_per_step, schedule, sequences, solo_outputs, weights
from .helpers import pool_options

TOL = {"rtol": 1e-10, "atol": 1e-10}

CASES = [  # lengths, start_steps
    ([5, 3, 2], None),  # exits in the middle of the decode: 2 leaves after step 1, 1 after step 2
    ([1, 7], None),
    ([5, 3, 2], [0, 2, 6]),  # 1 joins after 0 has 2 tokens; 2 joins after 1 left
    ([5, 3, 2], [3, 0, 1]),  # 0 joins last and outlives the others
    ([1, 7], [4, 0]),
    ([1, 7], [0, 3]),  # a gap: no sequence in the batch at steps 1 and 2
    ([4, 0, 6, 2], [1, 0, 0, 5]),  # an empty sequence never joins
]


@pytest.fixture(params=kv.RAGGED_STRATEGIES)
def strategy(request):
    return request.param


@pytest.mark.parametrize("lengths, start_steps", CASES)
@pytest.mark.parametrize("block_size", [1, 3, 16])  # paged's; 16: larger than every sequence
def test_every_step_equals_each_sequence_decoded_alone(strategy, lengths, start_steps, block_size):
    rng = np.random.default_rng(sum(lengths))
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    solo = solo_outputs(seqs, w_q, w_k, w_v)
    expected_steps = list(schedule(lengths, start_steps).values())
    steps = kv.ragged_decode_steps(
        seqs, w_q, w_k, w_v, start_steps=start_steps, strategy=strategy, **pool_options(strategy, block_size)
    )
    n_steps = 0
    for (seq_ids, positions, out), expected in zip(steps, expected_steps, strict=True):
        assert sorted(zip(seq_ids.tolist(), positions.tolist())) == expected
        for seq, position, row in zip(seq_ids, positions, out):
            np.testing.assert_allclose(row, solo[seq][position], **TOL)
        n_steps += 1
    assert n_steps == len(expected_steps)


@pytest.mark.parametrize("lengths, start_steps", CASES)
def test_outputs_equal_the_foundations_single_sequence_decode(strategy, lengths, start_steps):
    rng = np.random.default_rng(7)
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    out = kv.ragged_decode(seqs, w_q, w_k, w_v, start_steps=start_steps, strategy=strategy, **pool_options(strategy, 3))
    assert isinstance(out, list) and len(out) == len(seqs)
    for got, seq in zip(out, seqs):
        assert got.shape == (len(seq), 5) and got.dtype == np.float64
        np.testing.assert_allclose(got, kv.cached_attention_preallocated(seq, w_q, w_k, w_v), **TOL)


def test_the_three_strategies_agree_and_compacted_matches_the_batched_decode_for_equal_lengths():
    rng = np.random.default_rng(8)
    x, (w_q, w_k, w_v) = rng.standard_normal((3, 6, 4)), weights(rng)
    batched = kv.batched_cached_attention(x, w_q, w_k, w_v)
    for strategy in kv.RAGGED_STRATEGIES:
        np.testing.assert_allclose(kv.ragged_decode(x, w_q, w_k, w_v, strategy=strategy), batched, **TOL)


def test_padded_form_returns_zeros_past_each_length_and_never_reads_the_padding(strategy):
    rng = np.random.default_rng(9)
    lengths = [5, 3, 0, 2]
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    x = np.full((4, 6, 4), np.nan)  # T_max = 6 > every length: the padding is NaN
    for b, seq in enumerate(seqs):
        x[b, : len(seq)] = seq
    out = kv.ragged_decode(x, w_q, w_k, w_v, lengths=lengths, strategy=strategy, start_steps=[1, 0, 0, 2])
    assert out.shape == (4, 6, 5)
    for b, (seq, expected) in enumerate(zip(seqs, solo_outputs(seqs, w_q, w_k, w_v))):
        np.testing.assert_allclose(out[b, : len(seq)], expected, **TOL)
        assert (out[b, len(seq) :] == 0).all()


def test_padded_x_without_lengths_is_all_full_length():
    rng = np.random.default_rng(10)
    x, (w_q, w_k, w_v) = rng.standard_normal((2, 4, 4)), weights(rng)
    np.testing.assert_allclose(kv.ragged_decode(x, w_q, w_k, w_v), kv.causal_attention(x, w_q, w_k, w_v), **TOL)


def test_empty_batches_and_empty_sequences(strategy):
    rng = np.random.default_rng(11)
    w_q, w_k, w_v = weights(rng)
    assert kv.ragged_decode([], w_q, w_k, w_v, strategy=strategy) == []
    out = kv.ragged_decode([np.zeros((0, 4)), np.zeros((0, 4))], w_q, w_k, w_v, strategy=strategy)
    assert [o.shape for o in out] == [(0, 5), (0, 5)]
    padded = kv.ragged_decode(np.zeros((2, 3, 4)), w_q, w_k, w_v, lengths=[0, 0], strategy=strategy)
    assert padded.shape == (2, 3, 5) and not padded.any()


def test_float32_in_float32_out_and_mixed_is_float64(strategy):
    rng = np.random.default_rng(12)
    seqs, (w_q, w_k, w_v) = sequences(rng, [3, 2]), weights(rng)
    single = [s.astype(np.float32) for s in seqs]
    w32 = [w.astype(np.float32) for w in (w_q, w_k, w_v)]
    out32 = kv.ragged_decode(single, *w32, strategy=strategy)
    assert all(o.dtype == np.float32 for o in out32)
    for got, expected in zip(out32, solo_outputs(single, *w32)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert kv.ragged_decode([single[0], seqs[1]], *w32, strategy=strategy)[0].dtype == np.float64


@pytest.mark.parametrize("lengths, start_steps", CASES)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_reported_counts(strategy, lengths, start_steps, block_size):
    rng = np.random.default_rng(13)
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    _, stats = kv.ragged_decode(
        seqs, w_q, w_k, w_v, start_steps=start_steps, strategy=strategy, **pool_options(strategy, block_size),
        return_stats=True,
    )
    n_steps, n_seqs, t_max = len(schedule(lengths, start_steps)), len(lengths), max(lengths)
    assert stats.strategy == strategy and stats.steps == n_steps
    if strategy == "padded":
        assert stats.row_steps == n_seqs * n_steps
    else:
        assert stats.row_steps == sum(lengths)
    if strategy == "paged":
        peak = max(blocks_per_step(lengths, start_steps, block_size))
        assert stats.peak_blocks == peak and stats.peak_reserved_slots == peak * block_size
        assert stats.moved_slots == 0
    else:
        assert stats.peak_blocks is None and stats.peak_reserved_slots == n_seqs * t_max
    if strategy == "padded":
        assert stats.moved_slots == 0


@pytest.mark.parametrize(
    "lengths, moved",
    [
        ([5, 3, 2], 0),  # each leaver is in the last row in use: nothing moves
        ([2, 5, 4], 2 + 4),  # step 2: sequence 2 (2 positions) into row 0; step 4: sequence 1 (4) into row 0
        ([6, 2, 2, 2], 0),  # three leave at once from the rows past the survivor: nothing moves
        ([2, 2, 5, 2], 2),  # three leave at once: only sequence 2 (2 positions) moves, into row 0
    ],
)
def test_compaction_moves_only_survivors_past_the_new_end(lengths, moved):
    rng = np.random.default_rng(14)
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    out, stats = kv.ragged_decode(seqs, w_q, w_k, w_v, return_stats=True)
    assert stats.moved_slots == moved
    for got, expected in zip(out, solo_outputs(seqs, w_q, w_k, w_v)):
        np.testing.assert_allclose(got, expected, **TOL)


def test_paged_decode_reuses_freed_blocks_in_a_pool_smaller_than_the_batch():
    # [5, 3, 2] with block_size 1 needs 10 blocks without reuse; at most 6 are held at once.
    rng = np.random.default_rng(15)
    seqs, (w_q, w_k, w_v) = sequences(rng, [5, 3, 2]), weights(rng)
    assert max(blocks_per_step([5, 3, 2], None, 1)) == 6
    out = kv.ragged_decode(seqs, w_q, w_k, w_v, strategy="paged", block_size=1, num_blocks=6)
    for got, expected in zip(out, solo_outputs(seqs, w_q, w_k, w_v)):
        np.testing.assert_allclose(got, expected, **TOL)


@pytest.mark.parametrize("lengths, start_steps", CASES[:6])
@pytest.mark.parametrize("block_size", [1, 3])
def test_a_pool_too_small_for_the_peak_is_refused_before_the_first_step(lengths, start_steps, block_size):
    # The peak is counted by hand (blocks_per_step) and by the decode before it writes anything.
    rng = np.random.default_rng(16)
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    peak = max(blocks_per_step(lengths, start_steps, block_size))
    with pytest.raises(kv.OutOfBlocksError, match=f"needs {peak} blocks at its peak, {peak - 1} of num_blocks={peak - 1}"):
        kv.ragged_decode_steps(seqs, w_q, w_k, w_v, start_steps=start_steps, strategy="paged",
                               block_size=block_size, num_blocks=peak - 1)
    out = kv.ragged_decode(seqs, w_q, w_k, w_v, start_steps=start_steps, strategy="paged", block_size=block_size,
                           num_blocks=peak)
    for got, expected in zip(out, solo_outputs(seqs, w_q, w_k, w_v)):
        np.testing.assert_allclose(got, expected, **TOL)


def test_a_poisoned_pool_does_not_leak_into_any_output(monkeypatch):
    # Every slot of the pool (the last block included) starts at 1e300. The free queue hands out blocks in
    # id order and takes a freed one back first, so the 7 blocks of the peak never reach block 8; the
    # unwritten slots of every block in use stay poisoned.
    # A gather through a wrong or zero-filled table entry, or a missing mask, shows.
    rng = np.random.default_rng(17)
    lengths, start_steps = [5, 3, 2, 7], [0, 1, 4, 2]
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    pools = []

    class PoisonedPool(kv.PagedKVCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.k_cache[:], self.v_cache[:] = 1e300, -1e300
            pools.append(self)

    monkeypatch.setattr("kv_attention.ragged.PagedKVCache", PoisonedPool)
    out = kv.ragged_decode(seqs, w_q, w_k, w_v, start_steps=start_steps, strategy="paged", block_size=3, num_blocks=9)
    for got, expected in zip(out, solo_outputs(seqs, w_q, w_k, w_v)):
        np.testing.assert_allclose(got, expected, **TOL)
    (pool,) = pools
    assert (pool.k_cache[8] == 1e300).all()  # block 8 stayed unused and poisoned
    assert (pool.k_cache == 1e300).any(axis=-1).sum() > 9  # unwritten slots of used blocks too


def test_the_poisoned_pool_would_show_a_zero_filled_table_entry():
    # The check above can fail: a table entry sent to an unused block puts 1e300 where a key belongs.
    cache = kv.PagedKVCache(4, 2, 3, 5)
    cache.k_cache[:] = 1e300
    cache.add_sequence(0)
    cache.update([0], np.ones((1, 3, 3)), np.ones((1, 3, 5)))
    cache._block_tables[0][0] = 3
    k_seq, _, _ = cache.gather([0])
    assert (k_seq[0, :3] == 1e300).any()


def test_masked_attend_gives_zeros_for_a_row_with_nothing_to_attend_to():
    rng = np.random.default_rng(18)
    q, k, v = rng.standard_normal((3, 1, 4)), rng.standard_normal((3, 5, 4)), rng.standard_normal((3, 5, 2))
    k[:, 3:] = 1e300  # masked keys whose scores overflow to +-inf
    valid = np.array([[True] * 3 + [False] * 2, [False] * 5, [True] + [False] * 4])
    with np.errstate(all="raise"):
        out = masked_attend(q, k, v, valid)
    assert out.shape == (3, 1, 2) and np.isfinite(out).all()
    assert (out[1] == 0).all()
    for n, count in ((0, 3), (2, 1)):  # softmax over the valid keys only, written out here
        scores = [float(q[n, 0] @ k[n, s]) / 2.0 for s in range(count)]
        weights_ = np.exp(np.array(scores) - max(scores))
        np.testing.assert_allclose(out[n, 0], (weights_ / weights_.sum()) @ v[n, :count], **TOL)


def test_every_sequence_grows_from_its_own_length_when_others_join_and_leave():
    # With a shared write position (the longest, first or last row's) a row would overwrite
    # or skip positions; its next outputs would then differ from its solo decode.
    rng = np.random.default_rng(19)
    lengths, start_steps = [6, 2, 5, 3], [0, 1, 2, 6]
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    solo = solo_outputs(seqs, w_q, w_k, w_v)
    for strategy in kv.RAGGED_STRATEGIES:
        for got, expected in zip(kv.ragged_decode(seqs, w_q, w_k, w_v, start_steps=start_steps, strategy=strategy), solo):
            np.testing.assert_allclose(got, expected, **TOL)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"strategy": "bucketed"}, ValueError, "unknown strategy 'bucketed'; known: padded, compacted, paged"),
        ({"strategy": ["paged"]}, ValueError, r"unknown strategy \['paged'\]"),
        ({"block_size": 0}, ValueError, "block_size must be >= 1"),
        ({"num_blocks": -1}, ValueError, "num_blocks must be >= 0"),
        ({"num_blocks": 2.0}, TypeError, "num_blocks must be an integer"),
        # The case: a pool size with a strategy that has no pool was ignored.
        ({"strategy": "compacted", "num_blocks": 0, "block_size": 1}, ValueError,
         r"^num_blocks=0 is for strategy='paged', got strategy='compacted'$"),
        ({"strategy": "padded", "num_blocks": 9}, ValueError,
         r"^num_blocks=9 is for strategy='paged', got strategy='padded'$"),
        # So was a block size with a strategy that has no blocks.
        ({"strategy": "compacted", "block_size": 4}, ValueError,
         r"^block_size=4 is for strategy='paged', got strategy='compacted'$"),
        ({"strategy": "padded", "block_size": 16}, ValueError,
         r"^block_size=16 is for strategy='paged', got strategy='padded'$"),
        ({"block_size": 1}, ValueError, r"^block_size=1 is for strategy='paged', got strategy='compacted'$"),  # default
        ({"lengths": [3, 2]}, ValueError, "lengths is for a padded x"),
        ({"start_steps": [0]}, ValueError, r"start_steps must be 2 integers, one per sequence, got \[0\]"),
        ({"start_steps": [0, -1]}, ValueError, r"start_steps\[1\] must be >= 0"),
        ({"start_steps": [0, 1.5]}, TypeError, r"start_steps\[1\] must be an integer"),
        ({"start_steps": 3}, ValueError, "start_steps must be 2 integers"),
    ],
)
def test_bad_options_are_refused(kwargs, error, message):
    rng = np.random.default_rng(20)
    seqs, (w_q, w_k, w_v) = sequences(rng, [3, 2]), weights(rng)
    with pytest.raises(error, match=message):
        kv.ragged_decode(seqs, w_q, w_k, w_v, **kwargs)
    with pytest.raises(error, match=message):  # refused before the first step is asked for
        kv.ragged_decode_steps(seqs, w_q, w_k, w_v, **kwargs)


def test_bad_sequences_are_refused_naming_them():
    rng = np.random.default_rng(21)
    seqs, (w_q, w_k, w_v) = sequences(rng, [3, 2]), weights(rng)
    bad_nan = [seqs[0], seqs[1].copy()]
    bad_nan[1][0, 0] = np.nan
    cases = [
        (bad_nan, ValueError, r"^x\[1\] contains NaN or inf$"),
        ([seqs[0], seqs[1][None]], ValueError, r"x\[1\] must be \[T_i, D_model\], got shape \(1, 2, 4\)"),
        ([seqs[0], seqs[1][:, :3]], ValueError, r"x\[0\] has 4, x\[1\] has shape \(2, 3\)"),
        ([seqs[0], seqs[1].astype(np.int64)], TypeError, r"x\[1\] must be a float32 or float64 array"),
        ("abc", TypeError, "x must be a list of"),
        (np.zeros((3, 4)), ValueError, r"a padded x must be \[B, T_max, D_model\], got shape \(3, 4\)"),
        ([seqs[0][:, :3], seqs[1][:, :3]], ValueError, r"w_q has 4 rows but x has D_model=3"),
    ]
    for x, error, message in cases:
        with pytest.raises(error, match=message):
            kv.ragged_decode(x, w_q, w_k, w_v)


def test_bad_padded_inputs_are_refused():
    rng = np.random.default_rng(22)
    w_q, w_k, w_v = weights(rng)
    x = rng.standard_normal((2, 4, 4))
    with pytest.raises(ValueError, match=r"lengths must be at most T_max=4 of x \(2, 4, 4\), got \[5, 1\]"):
        kv.ragged_decode(x, w_q, w_k, w_v, lengths=[5, 1])
    with pytest.raises(ValueError, match="lengths must be 2 integers"):
        kv.ragged_decode(x, w_q, w_k, w_v, lengths=[1, 2, 3])
    with pytest.raises(TypeError, match=r"lengths\[0\] must be an integer"):
        kv.ragged_decode(x, w_q, w_k, w_v, lengths=np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        kv.ragged_decode(x.astype(np.int64), w_q, w_k, w_v, lengths=[0, 0])
    x[1, 1, 0] = np.inf
    with pytest.raises(ValueError, match=r"^x\[1, :2\] contains NaN or inf$"):
        kv.ragged_decode(x, w_q, w_k, w_v, lengths=[4, 2])
    with pytest.raises(TypeError, match="x is a masked array"):
        kv.ragged_decode(np.ma.masked_array(x), w_q, w_k, w_v, lengths=[4, 1])


def test_inputs_are_not_written():
    rng = np.random.default_rng(24)
    seqs, ws = sequences(rng, [4, 2]), weights(rng)
    copies = [a.copy() for a in seqs + ws]
    for a in seqs + ws:
        a.flags.writeable = False
    for strategy in kv.RAGGED_STRATEGIES:
        kv.ragged_decode(seqs, *ws, strategy=strategy, start_steps=[1, 0])
    for a, original in zip(seqs + ws, copies):
        np.testing.assert_array_equal(a, original)  # against a copy


def test_default_pool_holds_every_sequence_at_full_length(monkeypatch):
    rng = np.random.default_rng(25)
    lengths = [33, 16, 1]
    seqs, ws = sequences(rng, lengths), weights(rng)
    pools = []
    monkeypatch.setattr("kv_attention.ragged.PagedKVCache", lambda *a, **k: pools.append(kv.PagedKVCache(*a, **k)) or pools[-1])
    kv.ragged_decode(seqs, *ws, strategy="paged", block_size=16)
    assert pools[0].num_blocks == 3 + 1 + 1 and pools[0].block_size == 16


def test_far_apart_start_steps_are_jumped_over_not_stepped_through():
    """A sequence joining at step 2**62 - 10 decodes at once, exactly as alone; beyond 2**62 is refused."""
    rng = np.random.default_rng(3)
    seqs = [rng.standard_normal((n, 4)) for n in (3, 2, 4)]
    w = [rng.standard_normal((4, 4)) / 2 for _ in range(3)]
    for strategy in kv.RAGGED_STRATEGIES:
        out, stats = kv.ragged_decode(seqs, *w, start_steps=[2**62 - 10, 0, 5], strategy=strategy, return_stats=True)
        for got, seq in zip(out, seqs):
            np.testing.assert_allclose(got, kv.causal_attention(seq, *w), rtol=1e-10, atol=1e-10)
        assert stats.steps == 3 + 2 + 4
    for bad in ([2**62 + 1, 0, 0], [10**30, 0, 0]):
        with pytest.raises(ValueError, match=r"start_steps\[0\]=\d+ is too large"):
            kv.ragged_decode(seqs, *w, start_steps=bad)


def test_an_empty_float32_batch_stays_float32():
    w = [np.ones((4, 3), np.float32)] * 3
    out = kv.ragged_decode(np.zeros((0, 5, 4), np.float32), *w, lengths=[])
    assert out.shape == (0, 5, 3) and out.dtype == np.float32


# --- properties (hypothesis): random lengths, join steps and so exit orders ------------------------


@st.composite
def ragged_problems(draw):
    """(seqs, weights, start_steps): 1-5 sequences of 0-9 tokens joining at steps 0-6, random widths and scale."""
    n_seqs = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(0, 9), min_size=n_seqs, max_size=n_seqs))
    start_steps = draw(st.lists(st.integers(0, 6), min_size=n_seqs, max_size=n_seqs))
    d_model, d_k, d_v = (draw(st.integers(1, 5)) for _ in range(3))
    scale = draw(st.floats(1e-3, 30.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    seqs = [rng.standard_normal((n, d_model)) * scale for n in lengths]
    weights = [rng.standard_normal((d_model, d)) / np.sqrt(d_model) for d in (d_k, d_k, d_v)]
    return seqs, weights, start_steps


@settings(max_examples=80, deadline=None)
@given(
    problem=ragged_problems(),
    strategy=st.sampled_from(kv.RAGGED_STRATEGIES),
    block_size=st.integers(1, 12),
    tight_pool=st.booleans(),
)
def test_every_sequence_equals_its_solo_decode(problem, strategy, block_size, tight_pool):
    seqs, weights, start_steps = problem
    lengths = [len(s) for s in seqs]
    # A tight pool holds only the most blocks in use at once, so freed blocks must be reused.
    tight = tight_pool and strategy == "paged"  # block_size and num_blocks are paged's alone
    num_blocks = max(blocks_per_step(lengths, start_steps, block_size), default=0) if tight else None
    out = kv.ragged_decode(
        seqs, *weights, start_steps=start_steps, strategy=strategy, **pool_options(strategy, block_size, num_blocks)
    )
    for got, expected in zip(out, solo_outputs(seqs, *weights), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(problem=ragged_problems())
def test_the_padded_form_gives_the_list_form_with_zeros_past_each_length(problem):
    seqs, weights, start_steps = problem
    t_max = max(len(s) for s in seqs) + 1
    x = np.full((len(seqs), t_max, seqs[0].shape[1]), 1e308)  # padding that would overflow if read
    for b, seq in enumerate(seqs):
        x[b, : len(seq)] = seq
    lengths = [len(s) for s in seqs]
    padded = kv.ragged_decode(x, *weights, lengths=lengths, start_steps=start_steps, strategy="padded")
    listed = kv.ragged_decode(seqs, *weights, start_steps=start_steps, strategy="padded")
    # Both forms are copied into the same padded problem, then the same computation runs: bit for bit.
    for b, got in enumerate(listed):
        np.testing.assert_array_equal(padded[b, : lengths[b]], got)
        assert not padded[b, lengths[b] :].any()


# --- a caller's paged cache ---------------------------------------------------------------------------


def test_paged_decode_in_a_callers_cache_is_exact_and_leaves_it_to_inspect():
    rng = np.random.default_rng(40)
    lengths = [5, 3, 2]
    seqs, (w_q, w_k, w_v) = sequences(rng, lengths), weights(rng)
    cache = kv.PagedKVCache(8, 2, 3, 5)
    cache.add_sequence("other")  # another user of the pool, kept through the decode
    cache.update(["other"], np.ones((1, 3, 3)), np.ones((1, 3, 5)))
    out, stats = kv.ragged_decode(seqs, w_q, w_k, w_v, strategy="paged", cache=cache, return_stats=True)
    for got, expected in zip(out, solo_outputs(seqs, w_q, w_k, w_v)):
        np.testing.assert_allclose(got, expected, **TOL)
    assert cache.seq_ids == ("other",) and cache.blocks_in_use == 2  # every decoded sequence freed its blocks
    assert cache.peak_blocks == 2 + max(blocks_per_step(lengths, None, 2)) == stats.peak_blocks
    assert stats.peak_reserved_slots == cache.peak_blocks * 2
    k_seq, _, _ = cache.gather(["other"])
    assert (k_seq[0, :3] == 1).all()


def test_a_callers_cache_too_small_is_refused_before_the_first_step():
    rng = np.random.default_rng(41)
    seqs, ws = sequences(rng, [4, 4]), weights(rng)
    cache = kv.PagedKVCache(3, 2, 3, 5)
    with pytest.raises(kv.OutOfBlocksError, match="needs 4 blocks at its peak, 3 of num_blocks=3 are free"):
        kv.ragged_decode(seqs, *ws, strategy="paged", cache=cache)
    assert cache.seq_ids == () and cache.peak_blocks == 0


@pytest.mark.parametrize(
    "make, options, error, message",
    [
        (lambda: kv.PagedKVCache(8, 2, 4, 5), {}, ValueError, r"holds .* \(4, 5, None, 1\), the computation needs "
                                                              r"\(3, 5, None, 1\)"),
        (lambda: kv.PagedKVCache(8, 2, 3, 6), {}, ValueError, r"holds .* \(3, 6, None, 1\)"),
        (lambda: kv.PagedKVCache(8, 2, 3, 5, dtype=np.float32), {}, TypeError, "cache holds float32 but the computation"),
        (lambda: kv.PagedKVCache(8, 2, 3, 5), {"block_size": 4}, ValueError, "block_size=4 was given with a cache"),
        (lambda: kv.PagedKVCache(8, 2, 3, 5), {"num_blocks": 8}, ValueError, "num_blocks=8 was given with a cache"),
        (lambda: kv.PagedKVCache(8, 2, 3, 5), {"strategy": "compacted"}, ValueError, "cache= is for strategy='paged'"),
        (lambda: kv.StaticCache((), 4, 3, 5), {}, TypeError, "cache must be a PagedKVCache, got StaticCache"),
    ],
)
def test_a_callers_cache_that_does_not_fit_is_refused_before_any_step(make, options, error, message):
    rng = np.random.default_rng(42)
    seqs, ws = sequences(rng, [3, 2]), weights(rng)
    cache = make()
    kwargs = {"strategy": "paged", "cache": cache, **options}
    with pytest.raises(error, match=message):
        kv.ragged_decode(seqs, *ws, **kwargs)
    with pytest.raises(error, match=message):
        kv.ragged_decode_steps(seqs, *ws, **kwargs)
    if isinstance(cache, kv.PagedKVCache):
        assert cache.seq_ids == () and cache.num_free_blocks == 8


def test_a_callers_cache_holding_the_decodes_sequence_ids_is_refused():
    rng = np.random.default_rng(43)
    seqs, ws = sequences(rng, [3, 2]), weights(rng)
    cache = kv.PagedKVCache(8, 2, 3, 5)
    cache.add_sequence(1)
    with pytest.raises(ValueError, match=r"cache already holds sequence\(s\) \[1\]; the decode's sequences are 0..1"):
        kv.ragged_decode(seqs, *ws, strategy="paged", cache=cache)
    assert cache.seq_ids == (1,)


# --- a failed or abandoned decode puts a caller's paged cache back ----------------------------------


def cache_state(cache):
    """Everything observable about a paged cache: the pool, every table and length, the free list in order,
    the refcounts, the peak and the blocks cached under each prefix."""
    ids = cache.seq_ids
    return (
        cache.k_cache.copy(), cache.v_cache.copy(), ids, [cache.block_table(s) for s in ids],
        [cache.get_seq_length(s) for s in ids], cache.block_pool.free_blocks(),
        [cache.ref_count(b) for b in range(cache.num_blocks)], cache.peak_blocks,
    )


def assert_same_state(before, after):
    np.testing.assert_array_equal(before[0], after[0])  # the pool put back from a copy: bit for bit
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2:] == after[2:]


def callers_cache(num_blocks, caching=False):
    """A cache with another user's sequence "other" (3 tokens of ones, 2 blocks of 2) and, with prefix caching,
    a freed sequence whose full block [7, 7] stays cached, evictable, holding keys of 2."""
    cache = kv.PagedKVCache(num_blocks, 2, 3, 5, enable_prefix_caching=caching)
    cache.add_sequence("other")
    cache.update(["other"], np.ones((1, 3, 3)), np.ones((1, 3, 5)), token_ids=[[1, 2, 3]])
    if caching:
        cache.add_sequence("gone")
        cache.update(["gone"], np.full((1, 2, 3), 2.0), np.full((1, 2, 5), 2.0), token_ids=[[7, 7]])
        cache.free("gone")
    return cache


@pytest.mark.parametrize("caching", [False, True])
def test_a_decode_that_runs_out_of_blocks_leaves_the_callers_cache_exactly_as_it_was(caching):
    rng = np.random.default_rng(44)
    seqs, ws = sequences(rng, [8, 8, 8]), weights(rng)
    cache = callers_cache(6, caching)  # 2 held, 4 free (with caching: 3 free + the cached one, which is evicted)
    before = cache_state(cache)
    with pytest.raises(kv.OutOfBlocksError):
        kv.ragged_decode(seqs, *ws, strategy="paged", cache=cache)
    assert_same_state(before, cache_state(cache))
    assert cache.seq_ids == ("other",)
    if caching:  # the evicted block is findable again, and holds its own keys
        (block,) = cache.find_cached_blocks([7, 7])
        assert (cache.k_cache[block] == 2.0).all()
    # and the cache serves: a decode that fits is exact
    out = kv.ragged_decode(seqs[:1], *ws, strategy="paged", cache=cache)
    np.testing.assert_allclose(out[0], solo_outputs(seqs[:1], *ws)[0], **TOL)


def test_the_tester_s_reproduction_leaves_no_sequence_behind():
    p = kv.make_problem(8, batch_size=3, d_model=8, d_k=4, d_v=4)
    cache = kv.PagedKVCache(2, 4, 4, 4)
    with pytest.raises(kv.OutOfBlocksError):
        kv.ragged_decode(*p.args(), strategy="paged", cache=cache)
    assert cache.seq_ids == () and cache.num_free_blocks == 2 and cache.peak_blocks == 0


def test_a_finished_step_iterator_keeps_what_the_decode_did():
    rng = np.random.default_rng(46)
    seqs, ws = sequences(rng, [4, 3]), weights(rng)
    cache = callers_cache(8)
    steps = list(kv.ragged_decode_steps(seqs, *ws, strategy="paged", cache=cache))
    assert len(steps) == 4 and cache.seq_ids == ("other",)
    assert cache.peak_blocks == 2 + max(blocks_per_step([4, 3], None, 2))  # not rolled back: the decode succeeded


@pytest.mark.parametrize("flag", ["no", 1, None])
def test_return_stats_must_be_true_or_false(flag):
    rng = np.random.default_rng(47)
    seqs, ws = sequences(rng, [3, 2]), weights(rng)
    with pytest.raises(TypeError, match=f"^return_stats must be True or False, got {flag!r}$"):
        kv.ragged_decode(seqs, *ws, return_stats=flag)
    out, stats = kv.ragged_decode(seqs, *ws, return_stats=np.True_)
    assert stats.steps == 3 and stats.row_steps == 5


