"""Property-based tests (hypothesis): random lengths, join steps and so exit orders, every strategy and block size."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_reference import blocks_per_step, solo_outputs

import kv_attention as kv


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
    num_blocks = max(blocks_per_step(lengths, start_steps, block_size), default=0) if tight_pool else None
    out = kv.ragged_decode(
        seqs, *weights, start_steps=start_steps, strategy=strategy, block_size=block_size, num_blocks=num_blocks
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
    for b, got in enumerate(listed):
        np.testing.assert_array_equal(padded[b, : lengths[b]], got)
        assert not padded[b, lengths[b] :].any()
