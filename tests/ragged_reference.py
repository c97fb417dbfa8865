"""Independent expectations for ragged decode: the schedule, the solo outputs and the block counts.

Written from the issue's definitions, sharing no code with kv_attention.ragged.
"""

import math

import numpy as np
from conftest import naive_causal_attention


def schedule(lengths, start_steps=None):
    """``{step: [(sequence, position), ...]}`` for every step with a sequence in the batch."""
    start_steps = start_steps or [0] * len(lengths)
    steps = {}
    for seq, (length, start) in enumerate(zip(lengths, start_steps)):
        for position in range(length):
            steps.setdefault(start + position, []).append((seq, position))
    return dict(sorted(steps.items()))


def solo_outputs(seqs, w_q, w_k, w_v):
    """Each sequence decoded alone by the naive loop-by-loop reference: a list of ``[T_i, D_v]``."""
    return [naive_causal_attention(seq, w_q, w_k, w_v) for seq in seqs]


def blocks_per_step(lengths, start_steps, block_size):
    """Blocks held at each scheduled step, after its tokens are written: sum of ceil((position + 1) / block_size)."""
    return [
        sum(math.ceil((position + 1) / block_size) for _, position in rows)
        for rows in schedule(lengths, start_steps).values()
    ]


def sequences(rng, lengths, d_model=4):
    return [rng.standard_normal((n, d_model)) for n in lengths]


def weights(rng, d_model=4, d_k=3, d_v=5):
    return [rng.standard_normal((d_model, d)) / np.sqrt(d_model) for d in (d_k, d_k, d_v)]
