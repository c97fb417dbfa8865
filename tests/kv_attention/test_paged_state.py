"""PagedKVCache under random sequences of add / update / fork / free / crop / allocate_slots / checkpoint and restore
(hypothesis stateful testing).

Some of them are refused (too many positions, a bad shape): the cache must be exactly as before.

After every operation: refcounts are the number of block tables holding each
block (so never negative); the free list holds each free block once, no block is
both free and held, and free + held = num_blocks; blocks_in_use counts a shared
block once; and every sequence gathers exactly the keys and values of its own tokens.

The keys and values written are a function of the whole token prefix up to
their position (as in a transformer, where they depend on every earlier token),
drawn here from a generator seeded by that prefix. So a block read through
the wrong table, a missing copy-on-write, or a prefix-cache hit on a stale or
wrongly chained hash gives values that differ from the expected ones. A gather
returns copies of what was written: they are compared bit for bit.
"""

import functools
import math

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kv_attention as kv

D_K, D_V = 2, 3
VOCAB = 3  # few token ids, so that prefixes repeat and the prefix cache hits


@functools.lru_cache(maxsize=None)
def kv_of_prefix(prefix):
    """The key and value written at the last position of ``prefix`` (a tuple of token ids)."""
    row = np.random.default_rng([len(prefix), *prefix]).standard_normal(D_K + D_V)
    return row[:D_K], row[D_K:]


def kv_rows(tokens):
    """``(k [T, D_K], v [T, D_V])`` of a sequence of ``tokens``, position by position."""
    rows = [kv_of_prefix(tuple(tokens[: p + 1])) for p in range(len(tokens))]
    return (np.array([k for k, _ in rows]).reshape(-1, D_K), np.array([v for _, v in rows]).reshape(-1, D_V))


token_lists = st.lists(st.integers(0, VOCAB - 1), max_size=9)


class PagedCacheMachine(RuleBasedStateMachine):
    """The cache under test beside the model: each sequence's token ids."""

    @initialize(num_blocks=st.integers(1, 8), block_size=st.integers(1, 3), caching=st.booleans())
    def make_cache(self, num_blocks, block_size, caching):
        self.cache = kv.PagedKVCache(num_blocks, block_size, D_K, D_V, enable_prefix_caching=caching)
        self.tokens = {}  # seq_id -> token ids written
        self.history = [[]]  # every sequence's token ids when last written: prefixes to hit the cache with
        self.next_id = 0
        self.saved = None  # (checkpoint, the pool's state, the tokens) of the last checkpoint taken

    def new_id(self):
        self.next_id += 1
        return self.next_id - 1

    @rule(prefix=token_lists)
    def add(self, prefix):
        self.add_with(prefix)

    @rule(data=st.data(), extra=token_lists)
    def add_a_known_prefix(self, data, extra):
        """A new sequence starting with the tokens some sequence held: it hits the cache if they are still there."""
        known = data.draw(st.sampled_from(self.history))
        self.add_with(known[: data.draw(st.integers(0, len(known)))] + extra)

    def add_with(self, prefix):
        seq_id = self.new_id()
        hits = self.cache.find_cached_blocks(prefix)
        held = self.cache.add_sequence(seq_id, prefix)
        size = self.cache.block_size
        assert held == len(hits) * size and held <= len(prefix)
        if not self.cache.enable_prefix_caching:
            assert held == 0
        assert self.cache.block_table(seq_id) == hits
        self.tokens[seq_id] = prefix[:held]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), t_new=st.integers(1, 4))
    def update_one(self, data, t_new):
        self.update_with(data, [data.draw(st.sampled_from(sorted(self.tokens)))], t_new)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), t_new=st.integers(0, 4))
    def update(self, data, t_new):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), min_size=1, max_size=3, unique=True))
        self.update_with(data, ids, t_new)

    def update_with(self, data, ids, t_new):
        new = [data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=t_new, max_size=t_new)) for _ in ids]
        rows = [kv_rows(self.tokens[s] + n) for s, n in zip(ids, new)]
        k = np.stack([r[0][len(r[0]) - t_new :] for r in rows]).reshape(len(ids), t_new, D_K)
        v = np.stack([r[1][len(r[1]) - t_new :] for r in rows]).reshape(len(ids), t_new, D_V)
        lower, upper = self.blocks_needed(ids, t_new)
        free, tables = self.cache.num_free_blocks, {s: self.cache.block_table(s) for s in self.tokens}
        try:
            self.cache.update(ids, k, v, token_ids=np.array(new, dtype=np.int64).reshape(len(ids), t_new))
        except kv.OutOfBlocksError:
            assert upper > free  # refused only when it may need more than is free, and changed nothing
            assert self.cache.num_free_blocks == free
            assert {s: self.cache.block_table(s) for s in self.tokens} == tables
            return
        assert lower <= free
        for seq_id, n in zip(ids, new):
            self.tokens[seq_id] = self.tokens[seq_id] + n
            self.history.append(self.tokens[seq_id])

    def blocks_needed(self, ids, t_new):
        """Bounds on the blocks an update takes: new blocks, plus at most one copy per sequence (of a shared last
        block, or of a cached one, which a crop left partly written)."""
        if t_new == 0:
            return 0, 0
        size, lower, shared = self.cache.block_size, 0, 0
        for seq_id in ids:
            table, length = self.cache.block_table(seq_id), len(self.tokens[seq_id])
            lower += max(0, math.ceil((length + t_new) / size) - len(table))
            last = table[length // size] if length % size else None
            shared += last is not None and (self.cache.ref_count(last) > 1 or self.cache.block_pool.is_cached(last))
        return lower, lower + shared

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self.new_id()
        counts = {b: self.cache.ref_count(b) for b in self.cache.block_table(parent)}
        self.cache.fork(parent, child)
        written = math.ceil(len(self.tokens[parent]) / self.cache.block_size)
        assert self.cache.block_table(child) == self.cache.block_table(parent)[:written]
        for block in self.cache.block_table(child):
            assert self.cache.ref_count(block) == counts[block] + 1
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        table, free = self.cache.block_table(seq_id), self.cache.num_free_blocks
        released = sum(self.cache.ref_count(b) == 1 for b in table)
        self.cache.free(seq_id)
        del self.tokens[seq_id]
        assert self.cache.num_free_blocks == free + released  # each block back once, at refcount 0

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(0, 6))
    def allocate_slots(self, data, n):
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        try:
            self.cache.allocate_slots(seq_id, n)
        except kv.OutOfBlocksError:
            return
        size = self.cache.block_size
        assert len(self.cache.block_table(seq_id)) >= math.ceil((len(self.tokens[seq_id]) + n) / size)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def crop(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        length = data.draw(st.integers(0, len(self.tokens[seq_id])))
        self.cache.crop(seq_id, length)
        self.tokens[seq_id] = self.tokens[seq_id][:length]
        assert self.cache.get_seq_length(seq_id) == length

    @rule()
    def take_a_checkpoint(self):
        self.saved = self.cache.checkpoint(), self.state(), dict(self.tokens), list(self.history)

    @precondition(lambda self: self.saved)
    @rule()
    def restore_the_checkpoint(self):
        """Whatever ran since the checkpoint (adds, updates, forks, frees, crops, evictions), a restore puts back
        every table, length, refcount, the free queue's order, the cached hashes and the peak; the cached blocks
        written over hold their K/V again (``every_sequence_gathers_its_own_tokens`` checks them after a hit)."""
        checkpoint, state, self.tokens, self.history = self.saved
        self.cache.restore(checkpoint)
        assert self.state() == state
        self.saved = None

    def state(self):
        """:meth:`observed` without the pools, with each sequence's recorded token ids and hashes, and the cached
        blocks."""
        cache = self.cache
        return (self.observed()[2:], repr(cache._token_ids), repr(cache._block_hashes), repr(cache._num_cached),
                [cache.block_pool.is_cached(b) for b in range(cache.num_blocks)])

    @rule(data=st.data())
    def a_refused_update_changes_nothing(self, data):
        """An update of more positions than the pool holds, or of k of the wrong width: refused, nothing changed."""
        if not self.tokens:
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), min_size=1, unique=True))
        before, t_new = self.observed(), self.cache.num_blocks * self.cache.block_size + 1
        k, v = np.zeros((len(ids), t_new, D_K)), np.zeros((len(ids), t_new, D_V))
        with pytest.raises(kv.OutOfBlocksError):
            self.cache.update(ids, k, v, token_ids=np.zeros((len(ids), t_new), np.int64))
        with pytest.raises(ValueError, match="k and v must be"):
            self.cache.update(ids, k[:, :1, :-1], v[:, :1])
        after = self.observed()
        np.testing.assert_array_equal(after[0], before[0])
        np.testing.assert_array_equal(after[1], before[1])
        assert after[2:] == before[2:]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), t_new=st.integers(1, 4), with_token_ids=st.booleans())
    def a_call_that_fails_after_taking_its_slots_is_undone(self, data, t_new, with_token_ids):
        """A model's call that took its slots and wrote them (zeros: no sequence's k/v), then failed in a later layer:
        restored from its checkpoint, the pool's state is as before, and the cached blocks it wrote over hold their
        contents again (``every_sequence_gathers_its_own_tokens`` checks them after a hit)."""
        ids = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), min_size=1, max_size=3, unique=True))
        if self.cache._blocks_needed(ids, t_new) > self.cache.num_free_blocks:
            return
        before = self.state()
        checkpoint = self.cache.checkpoint()
        token_ids = np.zeros((len(ids), t_new), np.int64) if with_token_ids else None
        slot_mapping = self.cache.append_slots(ids, t_new, token_ids)
        self.cache.write_slots(0, slot_mapping, np.zeros((len(ids), t_new, D_K)), np.zeros((len(ids), t_new, D_V)))
        self.cache.restore(checkpoint)
        assert self.state() == before

    def observed(self):
        """The pool, every table and length, the free list in order, the refcounts, the peak and the cached prefixes."""
        cache, ids = self.cache, self.cache.seq_ids
        return (
            cache.k_cache.copy(), cache.v_cache.copy(), ids, [cache.block_table(s) for s in ids],
            [cache.get_seq_length(s) for s in ids], cache.block_pool.free_blocks(),
            [cache.ref_count(b) for b in range(cache.num_blocks)], cache.peak_blocks,
            [cache.find_cached_blocks(tokens) for tokens in self.history],
        )

    @invariant()
    def refcounts_count_the_tables_holding_each_block(self):
        held = {}
        for seq_id in self.tokens:
            table = self.cache.block_table(seq_id)
            assert len(set(table)) == len(table)  # no block twice in one table
            for block in table:
                held[block] = held.get(block, 0) + 1
        for block in range(self.cache.num_blocks):
            assert self.cache.ref_count(block) == held.get(block, 0) >= 0
        free = self.cache.block_pool.free_blocks()
        assert len(set(free)) == len(free) and set(free).isdisjoint(held)
        assert len(free) + len(held) == self.cache.num_blocks
        assert self.cache.blocks_in_use == len(held) and self.cache.num_free_blocks == len(free)
        assert self.cache.peak_blocks >= self.cache.blocks_in_use

    @invariant()
    def every_sequence_gathers_its_own_tokens(self):
        ids = sorted(self.tokens)
        k, v, lengths = self.cache.gather(ids)
        for i, seq_id in enumerate(ids):
            expected_k, expected_v = kv_rows(self.tokens[seq_id])
            assert lengths[i] == len(expected_k)
            np.testing.assert_array_equal(k[i, : lengths[i]], expected_k)
            np.testing.assert_array_equal(v[i, : lengths[i]], expected_v)
        fill = {}
        for seq_id in ids:
            length = len(self.tokens[seq_id])
            for j, block in enumerate(self.cache.block_table(seq_id)[: math.ceil(length / self.cache.block_size)]):
                fill[block] = min(self.cache.block_size, length - j * self.cache.block_size)
        assert self.cache.slots_used == sum(fill.values()) <= self.cache.blocks_in_use * self.cache.block_size


PagedCacheMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestPagedCacheInvariants = PagedCacheMachine.TestCase
