"""Split-KV experiment: what the log-sum-exp merge costs in a decode, and what cascade attention saves.

The timed inputs, oracles and checks live here, in the suite, not in ``kv_attention``, for the reason given in
``common.py``. Commits without ``num_splits`` or ``cascade_attention`` skip
(NotImplementedError), so the whole history stays benchmarkable.

- Split-KV decode: one sequence of the heads experiment's gqa shape (8 query
  heads, 2 K/V heads, D_head 16, D_model 128), row 0 of ``heads_inputs("gqa", 2048)``.
  A full 2048-step decode at 16 splits takes seconds, so the benchmark decodes
  only the last ``SPLIT_STEPS`` positions over a cache prefilled (by the suite)
  with the first 2048 - SPLIT_STEPS: every timed step attends over about 2048 positions.
- Cascade: B = 8 sequences sharing a 1024-token prefix, each with its own 64-token
  suffix, single head, D = 64, one decode step (the query of each sequence's last
  position), from ``timed_inputs(1088, 8)``: the prefix is sequence 0's first 1024
  positions, the suffixes every sequence's last 64.
"""

import functools
import inspect
import math

import numpy as np

from .bench_heads import HEADS_HEAD_DIM, HEADS_N_HEADS, KINDS, heads_inputs
from .common import Benchmark, library_function, read_only, timed_inputs, verified_decode
from .counts import Counts

SPLIT_T = 2048  # positions in the cache at the last timed step
SPLIT_STEPS = 16  # positions decoded per timed call, the last ones of the 2048
SPLIT_PREFILL = SPLIT_T - SPLIT_STEPS
SPLIT_N_KV_HEADS = KINDS["gqa"]
NUM_SPLITS = [None, 1, 4, 16]  # None: multi_head_decode without num_splits, the baseline
CASCADE_BATCH = 8  # B
CASCADE_PREFIX = 1024  # S_p, shared by all B
CASCADE_SUFFIX = 64  # S_i, each sequence's own
CASCADE_STRATEGIES = ["concatenated", "cascade"]


@functools.lru_cache(maxsize=None)
def split_inputs():
    """``(x, w_q, w_k, w_v, w_o)``: x the whole sequence ``[2048, 128]``, read-only, identical for every commit."""
    x, w_q, w_k, w_v, w_o = heads_inputs("gqa", SPLIT_T)
    return read_only(x[0].copy(), w_q, w_k, w_v, w_o)


def prefilled_cache():
    """A new ``StaticCache((2,), 2048, 16, 16)`` of the commit, holding the K/V of the first SPLIT_PREFILL positions.

    The suite projects them itself: head j's keys are columns j·16..j·16+15 of ``x @ w_k``.
    """
    import kv_attention

    x, _, w_k, w_v, _ = split_inputs()
    per_head = (SPLIT_PREFILL, SPLIT_N_KV_HEADS, HEADS_HEAD_DIM)
    k = (x[:SPLIT_PREFILL] @ w_k).reshape(per_head).transpose(1, 0, 2)  # [H_kv, P, D_head]
    v = (x[:SPLIT_PREFILL] @ w_v).reshape(per_head).transpose(1, 0, 2)
    cache = kv_attention.StaticCache((SPLIT_N_KV_HEADS,), SPLIT_T, HEADS_HEAD_DIM, HEADS_HEAD_DIM)
    cache.update(k, v)
    return cache


def split_oracle(x, w_q, w_k, w_v, w_o, start):
    """Multi-head causal attention of positions ``start..T-1`` of ``x: [T, D_model]``, written here: ``[T - start, D_out]``.

    Query head h reads K/V head ``h // 4``; position i attends to positions 0..i.
    """
    d, group = HEADS_HEAD_DIM, HEADS_N_HEADS // SPLIT_N_KV_HEADS
    rows = np.arange(start, len(x))
    future = np.arange(len(x))[None, :] > rows[:, None]  # [T - start, T]
    heads = []
    for h in range(HEADS_N_HEADS):
        j = h // group
        q = x[start:] @ w_q[:, h * d : (h + 1) * d]  # [T - start, D_head]
        k, v = x @ w_k[:, j * d : (j + 1) * d], x @ w_v[:, j * d : (j + 1) * d]  # [T, D_head]
        scores = np.where(future, -np.inf, q @ k.T / math.sqrt(d))
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads.append((weights / weights.sum(axis=1, keepdims=True)) @ v)
    return np.concatenate(heads, axis=1) @ w_o  # [T - start, H_q·D_head] -> [T - start, D_out]


def split_decode(num_splits):
    """The commit's ``multi_head_decode`` bound to the gqa counts and ``num_splits`` (None: left out).

    NotImplementedError when the commit lacks it or its ``num_splits`` option.
    """
    function = library_function("multi_head_decode")
    options = dict(n_heads=HEADS_N_HEADS, n_kv_heads=SPLIT_N_KV_HEADS)
    if num_splits is not None:
        if "num_splits" not in inspect.signature(function).parameters:
            raise NotImplementedError("kv_attention.multi_head_decode has no num_splits at this commit")
        options["num_splits"] = num_splits
    return functools.partial(function, **options)


def verified_split_decode(num_splits):
    """:func:`split_decode`, once it decoded the last SPLIT_STEPS positions over a prefilled cache as the oracle does.

    rtol = atol = 1e-8; outcomes as :func:`common.verified_decode`.
    """
    decode = split_decode(num_splits)
    x, *weights = split_inputs()
    inputs = (x[SPLIT_PREFILL:], *weights)

    def on_a_prefilled_cache(*inputs):
        return decode(*inputs, cache=prefilled_cache())

    def reference(*_):
        return split_oracle(x, *weights, SPLIT_PREFILL)

    key = f"multi_head_decode, num_splits={num_splits}, last {SPLIT_STEPS} of T={SPLIT_T}"
    verified_decode(key, on_a_prefilled_cache, inputs, reference, rtol=1e-8, atol=1e-8)
    return decode, inputs


@functools.lru_cache(maxsize=None)
def cascade_inputs():
    """``(q, k_shared, v_shared, k_suffix, v_suffix)``, float64, read-only: q ``[8, 1, 64]``, prefix ``[1024, 64]``, suffixes ``[8, 64, 64]``."""
    x, w_q, w_k, w_v = timed_inputs(CASCADE_PREFIX + CASCADE_SUFFIX, CASCADE_BATCH)  # x: [8, 1088, 64]
    prefix, suffixes = x[0, :CASCADE_PREFIX], x[:, CASCADE_PREFIX:]  # [1024, 64], [8, 64, 64]
    q = x[:, -1:] @ w_q  # [8, 1, 64], each sequence's last position
    return read_only(q, prefix @ w_k, prefix @ w_v, suffixes @ w_k, suffixes @ w_v)


@functools.lru_cache(maxsize=None)
def concatenated_inputs():
    """``(q, k, v)``: each sequence's own full copy of prefix and suffix, ``k, v: [8, 1088, 64]``, as without sharing."""
    q, k_shared, v_shared, k_suffix, v_suffix = cascade_inputs()
    shape = (CASCADE_BATCH, CASCADE_PREFIX, k_shared.shape[1])
    k = np.concatenate([np.broadcast_to(k_shared, shape), k_suffix], axis=1)  # [8, 1088, 64]
    v = np.concatenate([np.broadcast_to(v_shared, shape), v_suffix], axis=1)
    return read_only(q, k, v)


def cascade_oracle(q, k, v):
    """Each sequence's query over its own ``k, v: [B, S, D]``, written here: ``[B, 1, D_v]``."""
    scores = np.einsum("bqd,bsd->bqs", q, k) / math.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def verified_cascade(strategy):
    """``(function, inputs)`` of ``strategy``, checked against :func:`cascade_oracle` over the concatenations.

    concatenated: the commit's ``attention_state`` over ``concatenated_inputs()``
    (its ``out``); cascade: its ``cascade_attention`` over ``cascade_inputs()``.
    rtol = atol = 1e-8; NotImplementedError when the commit lacks the function.
    """
    if strategy == "cascade":
        function, inputs = library_function("cascade_attention"), cascade_inputs()
    else:
        attention_state = library_function("attention_state")
        function, inputs = (lambda q, k, v: attention_state(q, k, v)[0]), concatenated_inputs()
    key = f"{strategy}, B={CASCADE_BATCH}, prefix {CASCADE_PREFIX}, suffixes {CASCADE_SUFFIX}"
    verified_decode(key, function, inputs, lambda *_: cascade_oracle(*concatenated_inputs()), rtol=1e-8, atol=1e-8)
    return function, inputs


def key_bytes_read(strategy):
    """Bytes of keys the strategy's attention reads, once each, from the shapes of its inputs.

    concatenated: every sequence's own copy of the prefix and its suffix, B × (S_p + S_i) × 64 × 8;
    cascade: the prefix once and every suffix, (S_p + B × S_i) × 64 × 8.
    """
    if strategy == "cascade":
        _, k_shared, _, k_suffix, _ = cascade_inputs()
        return k_shared.nbytes + k_suffix.nbytes
    return concatenated_inputs()[1].nbytes


class SplitDecode(Benchmark):
    """The last 16 steps of a 2048-position decode of one sequence ``x: [2048, 128]``, gqa (8 query, 2 K/V heads).

    Each timed call decodes positions 2032..2047 over a cache prefilled with the
    first 2032 (made fresh in setup, which asv runs before every timed call).
    num_splits None is ``multi_head_decode`` without it, the baseline; 1, 4 and 16
    split every head's keys into that many parts per step and merge their states.
    """

    params = [NUM_SPLITS]
    param_names = ["num_splits"]

    def setup(self, num_splits):
        self.decode, self.inputs = verified_split_decode(num_splits)
        self.cache = prefilled_cache()

    def time_decode(self, num_splits):
        self.decode(*self.inputs, cache=self.cache)
        self.cache.crop(self.cache.get_seq_length() - len(self.inputs[0]))  # back to the prefill, should asv not re-run setup

    time_decode.version = "1"


class CascadeAttention(Benchmark):
    """One decode step of B = 8 sequences sharing a 1024-token prefix, each with a 64-token suffix, D = 64.

    concatenated: each sequence attends over its own copy of prefix and suffix,
    ``[8, 1088, 64]``, as a cache without prefix sharing holds them; cascade: the
    prefix once for all eight queries in one product, merged with each suffix.
    """

    params = [CASCADE_STRATEGIES]
    param_names = ["strategy"]
    timeout = 60

    def setup(self, strategy):
        self.attend, self.inputs = verified_cascade(strategy)

    def time_attention(self, strategy):
        self.attend(*self.inputs)

    time_attention.version = "1"

    def track_key_bytes_read(self, strategy):
        """Bytes of keys read, from the input shapes: 8 x 1088 x 64 x 8 concatenated, (1024 + 8 x 64) x 64 x 8 cascade."""
        return key_bytes_read(strategy)

    track_key_bytes_read.unit = "bytes"
    track_key_bytes_read.version = "1"


class CascadeCounts(Counts):
    """Instructions and estimated cycles of one cascade-attention step of the 8 sequences, per strategy.

    The split decode is not counted: each call extends a cache prefilled with 2032 positions,
    so a counted call would have to make that cache again, and count it.
    """

    params = [CASCADE_STRATEGIES]
    param_names = ["strategy"]

    def prepare(self, strategy):
        return verified_cascade(strategy)
