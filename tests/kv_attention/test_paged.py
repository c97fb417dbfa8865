"""PagedKVCache: block tables, slot_mapping, the free list, out-of-blocks, and the reported figures.

Every expectation is computed here from the written values and block arithmetic,
independently of the cache's own bookkeeping. The pool stores copies of what was
written and gather() reads them back by index: keys and values are compared bit for bit.
"""

import math
import re

import numpy as np
import pytest

import kv_attention as kv

D_K, D_V = 3, 5


def random_kv(rng, n, t_new=1):
    return rng.standard_normal((n, t_new, D_K)), rng.standard_normal((n, t_new, D_V))


def snapshot(cache):
    """Everything observable about a cache, to compare before and after a failed call."""
    ids = cache.seq_ids
    return (
        cache.k_cache.copy(),
        cache.v_cache.copy(),
        ids,
        [cache.block_table(s) for s in ids],
        [cache.get_seq_length(s) for s in ids],
        cache.num_free_blocks,
        cache.peak_blocks,
    )


def assert_same_snapshot(before, after):
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2:] == after[2:]


class Contiguous:
    """The independent record: every position written, per sequence, in order."""

    def __init__(self):
        self.k, self.v = {}, {}

    def write(self, seq_ids, k, v):
        for i, s in enumerate(seq_ids):
            self.k.setdefault(s, []).extend(k[i])
            self.v.setdefault(s, []).extend(v[i])

    def free(self, seq_id):
        del self.k[seq_id], self.v[seq_id]


EVENTS = [
    ("add", "a"), ("add", "b"), ("add", "c"),
    ("write", ["a", "b", "c"]), ("write", ["a", "b", "c"]), ("write", ["a", "c"]), ("write", ["c", "a"]),
    ("free", "b"), ("write", ["a", "c"]), ("add", "d"), ("write", ["d", "a"]), ("write", ["c", "d", "a"]),
    ("free", "a"), ("write", ["c", "d"]), ("write", ["d"]), ("add", "a"), ("write", ["a", "c", "d"]),
]  # fmt: skip


@pytest.mark.parametrize("block_size", [1, 3, 4, 64])  # 64: larger than any sequence here
def test_gather_equals_the_contiguous_cache_exactly_through_joins_and_frees(block_size):
    rng = np.random.default_rng(block_size)
    cache, record = kv.PagedKVCache(40, block_size, D_K, D_V), Contiguous()
    for action, arg in EVENTS:
        if action == "add":
            cache.add_sequence(arg)
        elif action == "free":
            cache.free(arg)
            record.free(arg)
        else:
            k, v = random_kv(rng, len(arg))
            cache.update(arg, k, v)
            record.write(arg, k, v)
        ids = list(cache.seq_ids)
        k_seq, v_seq, lengths = cache.gather(ids)
        for i, s in enumerate(ids):
            expected_k = np.array(record.k.get(s, [])).reshape(-1, D_K)
            expected_v = np.array(record.v.get(s, [])).reshape(-1, D_V)
            assert lengths[i] == len(expected_k) == cache.get_seq_length(s)
            np.testing.assert_array_equal(k_seq[i, : lengths[i]], expected_k)
            np.testing.assert_array_equal(v_seq[i, : lengths[i]], expected_v)


def test_gather_equals_a_static_cache_fed_the_same_positions():
    rng = np.random.default_rng(1)
    paged, static = kv.PagedKVCache(8, 3, D_K, D_V), kv.StaticCache((), 10, D_K, D_V)
    paged.add_sequence(0)
    for _ in range(10):
        k, v = random_kv(rng, 1)
        paged.update([0], k, v)
        k_static, v_static = static.update(k[0], v[0])
        k_paged, v_paged, (length,) = paged.gather([0])
        np.testing.assert_array_equal(k_paged[0, :length], k_static)
        np.testing.assert_array_equal(v_paged[0, :length], v_static)


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_slot_mapping_is_block_times_block_size_plus_offset_and_holds_the_token(block_size):
    rng = np.random.default_rng(2)
    cache = kv.PagedKVCache(16, block_size, D_K, D_V)  # 2 sequences of 8 tokens
    for s in (0, 1):
        cache.add_sequence(s)
    for t_new in (1, 2, 4, 1):
        before = [cache.get_seq_length(s) for s in (0, 1)]
        k, v = random_kv(rng, 2, t_new)
        slot_mapping = cache.update([0, 1], k, v)
        assert slot_mapping.shape == (2, t_new) and slot_mapping.dtype == np.int64
        for i, s in enumerate((0, 1)):
            table = cache.block_table(s)
            for j, position in enumerate(range(before[i], before[i] + t_new)):
                block, offset = divmod(position, block_size)
                assert slot_mapping[i, j] == table[block] * block_size + offset
                np.testing.assert_array_equal(cache.k_cache[table[block], offset], k[i, j])
                np.testing.assert_array_equal(cache.v_cache[table[block], offset], v[i, j])


@pytest.mark.parametrize("block_size", [1, 3, 7])
def test_blocks_are_taken_only_when_the_last_block_is_full(block_size):
    rng = np.random.default_rng(3)
    cache = kv.PagedKVCache(20, block_size, D_K, D_V)
    cache.add_sequence("s")
    assert cache.block_table("s") == () and cache.blocks_in_use == 0
    for length in range(1, 15):
        cache.update(["s"], *random_kv(rng, 1))
        assert len(cache.block_table("s")) == math.ceil(length / block_size)
        assert len(set(cache.block_table("s"))) == len(cache.block_table("s"))  # distinct physical blocks
        assert cache.blocks_in_use + cache.num_free_blocks == 20


def test_reported_figures():
    rng = np.random.default_rng(4)
    cache = kv.PagedKVCache(10, 4, D_K, D_V)
    for s in range(3):
        cache.add_sequence(s)
    cache.update([0, 1, 2], *random_kv(rng, 3, 5))  # 5 tokens each: 2 blocks each, 3 slots empty each
    cache.update([0], *random_kv(rng, 1, 4))  # sequence 0: 9 tokens in 3 blocks
    assert cache.blocks_in_use == 3 + 2 + 2 and cache.num_free_blocks == 3
    assert cache.slots_used == 9 + 5 + 5  # of 7 * 4 slots allocated
    assert cache.nbytes == 19 * (D_K + D_V) * 8
    cache.free(0)
    assert cache.blocks_in_use == 4 and cache.peak_blocks == 7 and cache.slots_used == 4 * 4 - 2 * 3


def test_freed_blocks_return_to_the_free_list_and_are_reused():
    rng = np.random.default_rng(5)
    cache = kv.PagedKVCache(3, 2, D_K, D_V)  # room for 6 tokens
    cache.add_sequence("a")
    cache.update(["a"], *random_kv(rng, 1, 6))
    taken = set(cache.block_table("a"))
    assert taken == {0, 1, 2} and cache.num_free_blocks == 0
    cache.free("a")
    assert cache.num_free_blocks == 3 and cache.seq_ids == ()
    cache.add_sequence("b")
    k, v = random_kv(rng, 1, 5)
    cache.update(["b"], k, v)  # needs 3 blocks: only a's freed blocks exist
    assert set(cache.block_table("b")) == taken
    k_seq, v_seq, _ = cache.gather(["b"])
    np.testing.assert_array_equal(k_seq[0, :5], k[0])  # a's old tokens are not read
    np.testing.assert_array_equal(v_seq[0, :5], v[0])


def test_a_freed_block_is_the_next_one_taken():
    rng = np.random.default_rng(6)
    cache = kv.PagedKVCache(6, 2, D_K, D_V)
    for s in ("a", "b"):
        cache.add_sequence(s)
    cache.update(["a", "b"], *random_kv(rng, 2, 2))
    (freed,) = cache.block_table("a")
    cache.free("a")
    cache.update(["b"], *random_kv(rng, 1, 1))
    assert cache.block_table("b")[-1] == freed


def test_tokens_never_move_when_others_leave_join_and_grow():
    rng = np.random.default_rng(7)
    cache = kv.PagedKVCache(30, 3, D_K, D_V)
    for s in range(4):
        cache.add_sequence(s)
    cache.update([0, 1, 2, 3], *random_kv(rng, 4, 7))
    table = cache.block_table(2)
    k_blocks, v_blocks = cache.k_cache[list(table)].copy(), cache.v_cache[list(table)].copy()
    cache.free(0)
    cache.free(3)
    cache.add_sequence(9)
    cache.update([9, 1], *random_kv(rng, 2, 8))
    cache.free(1)
    cache.update([9], *random_kv(rng, 1, 4))
    assert cache.block_table(2) == table
    np.testing.assert_array_equal(cache.k_cache[list(table)], k_blocks)
    np.testing.assert_array_equal(cache.v_cache[list(table)], v_blocks)


def test_out_of_blocks_mid_decode_raises_its_own_error_and_changes_nothing():
    rng = np.random.default_rng(8)
    cache = kv.PagedKVCache(5, 2, D_K, D_V)
    for s in ("a", "b", "c"):
        cache.add_sequence(s)
    cache.update(["a", "b", "c"], *random_kv(rng, 3, 2))  # one full block each: 3 of 5 in use
    cache.update(["a"], *random_kv(rng, 1, 1))  # a takes its second block: 4 in use
    before = snapshot(cache)
    # b needs a block (1 free), c needs one too: 2 > 1, so neither may get one.
    with pytest.raises(kv.OutOfBlocksError, match=r"need 2 new block\(s\) of block_size=2, 1 of num_blocks=5 free"):
        cache.update(["b", "c"], *random_kv(rng, 2, 1))
    assert_same_snapshot(before, snapshot(cache))
    assert issubclass(kv.OutOfBlocksError, RuntimeError) and not issubclass(kv.OutOfBlocksError, ValueError)
    cache.update(["a", "b"], *random_kv(rng, 2, 1))  # a has room in its block, b takes the last one
    assert cache.num_free_blocks == 0


def test_an_empty_pool_and_zero_new_positions():
    cache = kv.PagedKVCache(0, 4, D_K, D_V)
    cache.add_sequence(0)
    assert cache.update([0], np.zeros((1, 0, D_K)), np.zeros((1, 0, D_V))).shape == (1, 0)
    k_seq, v_seq, lengths = cache.gather([0])
    assert k_seq.shape == (1, 0, D_K) and v_seq.shape == (1, 0, D_V) and lengths.tolist() == [0]
    with pytest.raises(kv.OutOfBlocksError, match="0 of num_blocks=0 free"):
        cache.update([0], np.zeros((1, 1, D_K)), np.zeros((1, 1, D_V)))


def test_gather_of_a_sequence_with_no_block_beside_others_is_zero():
    rng = np.random.default_rng(9)
    cache = kv.PagedKVCache(4, 2, D_K, D_V)
    cache.k_cache[:], cache.v_cache[:] = 7.0, 7.0
    for s in ("full", "empty"):
        cache.add_sequence(s)
    cache.update(["full"], *random_kv(rng, 1, 3))
    k_seq, v_seq, lengths = cache.gather(["empty", "full"])
    assert lengths.tolist() == [0, 3] and k_seq.shape == (2, 4, D_K)
    assert not k_seq[0].any() and not v_seq[0].any()


def test_gather_reads_only_the_sequences_own_blocks():
    # Block 11 is never taken here (the free queue hands out blocks in id order):
    # poison it and every unwritten slot, then nothing poisoned may appear at a
    # position below a sequence's length, and the padding repeats its own blocks.
    rng = np.random.default_rng(10)
    poison = 1e300
    cache = kv.PagedKVCache(12, 3, D_K, D_V)
    cache.k_cache[:], cache.v_cache[:] = poison, -poison
    lengths = {"long": 8, "short": 2}
    for s, n in lengths.items():
        cache.add_sequence(s)
        cache.update([s], *random_kv(rng, 1, n))
    assert 11 not in cache.block_table("long") + cache.block_table("short")
    k_seq, v_seq, gathered = cache.gather(["short", "long"])
    for i, s in enumerate(["short", "long"]):
        assert (np.abs(k_seq[i, : gathered[i]]) < 1e10).all() and (np.abs(v_seq[i, : gathered[i]]) < 1e10).all()
        own = cache.block_table(s)
        for chunk in k_seq[i].reshape(-1, 3, D_K):  # every gathered block is one of its own
            assert any(np.array_equal(chunk, cache.k_cache[b]) for b in own)


@pytest.mark.parametrize(
    "seq_ids, k_shape, v_shape, error, message",
    [
        (["a", "zz"], (2, 1, D_K), (2, 1, D_V), ValueError, "sequence 'zz' is not in the cache"),
        (["a", "a"], (2, 1, D_K), (2, 1, D_V), ValueError, "seq_ids repeats a sequence"),
        (["a"], (2, 1, D_K), (2, 1, D_V), ValueError, r"for N=1 seq_ids.*got k \(2, 1, 3\)"),
        (["a"], (1, 1, D_K + 1), (1, 1, D_V), ValueError, r"D_k=3, D_v=5: got k \(1, 1, 4\)"),
        (["a"], (1, 2, D_K), (1, 1, D_V), ValueError, r"got k \(1, 2, 3\), v \(1, 1, 5\)"),
        (["a"], (1, D_K), (1, D_V), ValueError, r"got k \(1, 3\), v \(1, 5\)"),
        ("a", (1, 1, D_K), (1, 1, D_V), TypeError, "seq_ids must be a list, tuple or array of sequence ids"),
            ({"a"}, (1, 1, D_K), (1, 1, D_V), TypeError, "seq_ids must be a list, tuple or array"),
    ],
)
def test_bad_updates_raise_and_change_nothing(seq_ids, k_shape, v_shape, error, message):
    cache = kv.PagedKVCache(4, 2, D_K, D_V)
    cache.add_sequence("a")
    cache.update(["a"], np.ones((1, 3, D_K)), np.ones((1, 3, D_V)))
    before = snapshot(cache)
    with pytest.raises(error, match=message):
        cache.update(seq_ids, np.zeros(k_shape), np.zeros(v_shape))
    assert_same_snapshot(before, snapshot(cache))


def test_bad_values_and_dtypes_raise_and_change_nothing():
    cache = kv.PagedKVCache(4, 2, D_K, D_V, dtype=np.float32)
    cache.add_sequence(0)
    before = snapshot(cache)
    k, v = np.ones((1, 1, D_K)), np.ones((1, 1, D_V))
    with pytest.raises(TypeError, match="fit the pool's float32"):
        cache.update([0], k, v)  # float64 into float32
    with pytest.raises(TypeError, match="must both be float32 or both float64"):
        cache.update([0], k.astype(np.float32), v)
    with pytest.raises(ValueError, match="^k contains NaN or inf$"):
        cache.update([0], np.full((1, 1, D_K), np.nan, np.float32), v.astype(np.float32))
    with pytest.raises(TypeError, match="k must be a float32 or float64 array"):
        cache.update([0], k.astype(np.int64), v)
    assert_same_snapshot(before, snapshot(cache))


def test_sequence_bookkeeping_errors():
    cache = kv.PagedKVCache(2, 2, D_K, D_V)
    cache.add_sequence(1)
    with pytest.raises(ValueError, match="sequence 1 is already in the cache"):
        cache.add_sequence(1)
    with pytest.raises(TypeError, match="a sequence id must be hashable"):
        cache.add_sequence([1])
    for call in (cache.free, cache.get_seq_length, cache.block_table):
        with pytest.raises(ValueError, match=r"sequence 2 is not in the cache; known: \[1\]"):
            call(2)
    with pytest.raises(ValueError, match="sequence 2 is not in the cache"):
        cache.gather([1, 2])


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((-1, 2, 3, 5), ValueError, "num_blocks must be >= 0"),
        ((4, 0, 3, 5), ValueError, "block_size must be >= 1"),
        ((4, 2.0, 3, 5), TypeError, "block_size must be an integer"),
        ((4, 2, 3, 5, np.int32), TypeError, "float32, float64, bfloat16 or float16"),
        ((4, 2, 3, 5, None), TypeError, "^dtype must be float32, float64, bfloat16 or float16, got None$"),
    ],
)
def test_constructor_checks_its_arguments(args, error, message):
    with pytest.raises(error, match=message):
        kv.PagedKVCache(*args)


@pytest.mark.parametrize("flag", ["yes", "no", 1, 0, None, np.array([True])])
def test_enable_prefix_caching_must_be_true_or_false(flag):
    # A truthy "no" once turned prefix caching on.
    with pytest.raises(TypeError, match=f"^enable_prefix_caching must be True or False, got {re.escape(repr(flag))}$"):
        kv.PagedKVCache(4, 2, 3, 5, enable_prefix_caching=flag)
    assert kv.PagedKVCache(4, 2, 3, 5, enable_prefix_caching=np.True_).enable_prefix_caching is True


def test_gather_and_lengths_take_only_ordered_id_lists():
    """A bare string is one id, never its characters: gather("ab") must not read 'a' and 'b'."""
    cache = kv.PagedKVCache(8, 2, 1, 1)
    for s in ("a", "b", "ab"):
        cache.add_sequence(s)
    cache.update(["a", "b", "ab"], np.array([[[1.0]], [[2.0]], [[3.0]]]), np.array([[[10.0]], [[20.0]], [[30.0]]]))
    for bad in ("ab", {"a", "b"}, {"a": 1}, 5):
        with pytest.raises(TypeError, match="seq_ids must be a list, tuple or array"):
            cache.gather(bad)
        with pytest.raises(TypeError, match="seq_ids must be a list, tuple or array"):
            cache.get_seq_lengths(bad)
    k, v, lengths = cache.gather(["ab"])
    assert v[0, 0, 0] == 30.0 and k[0, 0, 0] == 3.0 and lengths.tolist() == [1]


def test_zero_width_keys_are_refused_up_front_zero_width_values_are_not():
    # The library's one rule for zero sizes (test_zero_sizes.py): D_k >= 1, D_v >= 0.
    with pytest.raises(ValueError, match="^k_dim must be >= 1, got 0$"):
        kv.PagedKVCache(4, 4, 0, 3)
    assert kv.PagedKVCache(4, 4, 3, 0).v_cache.shape == (4, 4, 0)


# --- forks: shared blocks, refcounts and copy-on-write ----------------------------------------------


def written(rng, cache, record, seq_ids, t_new):
    """Write t_new random positions to seq_ids in ``cache`` and in the independent ``record``."""
    k, v = random_kv(rng, len(seq_ids), t_new)
    cache.update(seq_ids, k, v)
    record.write(seq_ids, k, v)


def assert_gathers_the_record(cache, record):
    ids = list(cache.seq_ids)
    k_seq, v_seq, lengths = cache.gather(ids)
    for i, s in enumerate(ids):
        expected_k = np.array(record.k.get(s, [])).reshape(-1, D_K)
        assert lengths[i] == len(expected_k)
        np.testing.assert_array_equal(k_seq[i, : lengths[i]], expected_k)
        np.testing.assert_array_equal(v_seq[i, : lengths[i]], np.array(record.v.get(s, [])).reshape(-1, D_V))


def fork_record(record, parent, child):
    record.k[child], record.v[child] = list(record.k[parent]), list(record.v[parent])


def test_a_fork_at_a_block_boundary_shares_every_block_and_copies_none():
    rng = np.random.default_rng(30)
    cache, record = kv.PagedKVCache(10, 4, D_K, D_V), Contiguous()
    cache.add_sequence("p")
    written(rng, cache, record, ["p"], 8)  # two full blocks
    cache.fork("p", "c")
    fork_record(record, "p", "c")
    shared = cache.block_table("p")
    assert cache.block_table("c") == shared and [cache.ref_count(b) for b in shared] == [2, 2]
    assert cache.blocks_in_use == 2 and cache.slots_used == 8
    written(rng, cache, record, ["c"], 1)  # a new block for the child; nothing to copy
    written(rng, cache, record, ["p"], 1)
    assert cache.block_table("c")[:2] == cache.block_table("p")[:2] == shared
    assert cache.block_table("c")[2] != cache.block_table("p")[2] and cache.blocks_in_use == 4
    assert_gathers_the_record(cache, record)


def test_a_fork_mid_block_copies_the_shared_last_block_on_the_first_write_only():
    rng = np.random.default_rng(31)
    cache, record = kv.PagedKVCache(10, 4, D_K, D_V), Contiguous()
    cache.add_sequence("p")
    written(rng, cache, record, ["p"], 6)  # block 0 full, block 1 holds 2 of 4
    cache.fork("p", "c")
    fork_record(record, "p", "c")
    full, partial = cache.block_table("p")
    assert cache.blocks_in_use == 2 and cache.ref_count(partial) == 2
    before = cache.k_cache[partial].copy()
    written(rng, cache, record, ["c"], 1)  # the child writes into the shared partial block: it gets a copy
    (_, copy) = cache.block_table("c")
    assert copy != partial and cache.block_table("p") == (full, partial)
    assert cache.ref_count(partial) == 1 and cache.ref_count(copy) == 1 and cache.ref_count(full) == 2
    np.testing.assert_array_equal(cache.k_cache[partial], before)  # the parent's block is untouched
    np.testing.assert_array_equal(cache.k_cache[copy, :2], before[:2])  # the copy holds the shared tokens
    written(rng, cache, record, ["p"], 1)  # no longer shared: the parent writes in place
    assert cache.block_table("p") == (full, partial) and cache.blocks_in_use == 3
    assert_gathers_the_record(cache, record)


def test_both_writing_at_once_after_a_mid_block_fork_copies_for_both_or_neither():
    rng = np.random.default_rng(32)
    cache, record = kv.PagedKVCache(4, 4, D_K, D_V), Contiguous()
    cache.add_sequence("p")
    written(rng, cache, record, ["p"], 2)
    cache.fork("p", "c")
    fork_record(record, "p", "c")
    cache.add_sequence("x")
    written(rng, cache, record, ["x"], 12)  # 3 blocks: none left free
    before = snapshot(cache)
    # p needs a copy of the shared block; c then holds it alone and writes in place: 1 block.
    with pytest.raises(kv.OutOfBlocksError, match=r"2 sequence\(s\) need 1 new block\(s\)"):
        cache.update(["p", "c"], *random_kv(rng, 2, 1))
    assert_same_snapshot(before, snapshot(cache))
    cache.free("x")
    record.free("x")
    shared = cache.block_table("p")[0]
    written(rng, cache, record, ["p", "c"], 1)
    assert cache.blocks_in_use == 2 and cache.block_table("c") == (shared,) and cache.block_table("p") != (shared,)
    assert cache.ref_count(shared) == 1
    assert_gathers_the_record(cache, record)


def test_freeing_the_parent_first_leaves_the_child_whole_and_frees_each_block_once():
    rng = np.random.default_rng(33)
    cache, record = kv.PagedKVCache(6, 3, D_K, D_V), Contiguous()
    cache.add_sequence("p")
    written(rng, cache, record, ["p"], 7)  # blocks: full, full, 1 of 3
    cache.fork("p", "c")
    fork_record(record, "p", "c")
    blocks = cache.block_table("p")
    cache.free("p")
    record.free("p")
    assert cache.blocks_in_use == 3 and cache.num_free_blocks == 3
    assert [cache.ref_count(b) for b in blocks] == [1, 1, 1]
    written(rng, cache, record, ["c"], 2)  # the last block is the child's alone now: written in place
    assert cache.block_table("c") == blocks
    assert_gathers_the_record(cache, record)
    cache.free("c")
    assert cache.num_free_blocks == 6 and sorted(cache.block_pool.free_blocks()) == list(range(6))
    assert all(cache.ref_count(b) == 0 for b in range(6))


def test_a_fork_shares_written_blocks_only_not_blocks_reserved_ahead():
    rng = np.random.default_rng(34)
    cache, record = kv.PagedKVCache(8, 2, D_K, D_V), Contiguous()
    cache.add_sequence("p")
    assert cache.allocate_slots("p", 5) == 3  # 3 blocks reserved for 5 tokens
    assert len(cache.block_table("p")) == 3 and cache.slots_used == 0  # reserved, none written
    written(rng, cache, record, ["p"], 3)  # writes into the reserved blocks, taking none
    assert cache.blocks_in_use == 3
    cache.fork("p", "c")
    fork_record(record, "p", "c")
    assert cache.block_table("c") == cache.block_table("p")[:2]
    assert cache.ref_count(cache.block_table("p")[2]) == 1
    written(rng, cache, record, ["p", "c"], 2)
    assert_gathers_the_record(cache, record)


def test_fork_errors_change_nothing():
    cache = kv.PagedKVCache(4, 2, D_K, D_V)
    cache.add_sequence("p")
    cache.update(["p"], np.ones((1, 3, D_K)), np.ones((1, 3, D_V)))
    cache.add_sequence("q")
    before = snapshot(cache)
    with pytest.raises(ValueError, match="sequence 'zz' is not in the cache"):
        cache.fork("zz", "c")
    with pytest.raises(ValueError, match="sequence 'q' is already in the cache"):
        cache.fork("p", "q")
    with pytest.raises(TypeError, match="must be hashable"):
        cache.fork("p", ["c"])
    assert_same_snapshot(before, snapshot(cache))
    assert [cache.ref_count(b) for b in cache.block_table("p")] == [1, 1]


def test_allocate_slots_is_all_or_nothing():
    cache = kv.PagedKVCache(3, 2, D_K, D_V)
    cache.add_sequence("a")
    with pytest.raises(kv.OutOfBlocksError, match=r"need 4 new block\(s\) of block_size=2, 3 of num_blocks=3 free"):
        cache.allocate_slots("a", 7)
    assert cache.block_table("a") == () and cache.num_free_blocks == 3
    assert cache.allocate_slots("a", 0) == 0 and cache.allocate_slots("a", 6) == 3 and cache.peak_blocks == 3
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        cache.allocate_slots("a", -1)


# --- prefix caching in the paged cache ------------------------------------------------------------


def test_a_sequence_starts_from_the_longest_cached_prefix_of_full_blocks():
    rng = np.random.default_rng(35)
    cache = kv.PagedKVCache(10, 2, D_K, D_V, enable_prefix_caching=True)
    tokens = [5, 6, 7, 8, 9]
    cache.add_sequence("a")
    k, v = random_kv(rng, 1, 5)
    cache.update(["a"], k, v, token_ids=[tokens])  # blocks [5, 6], [7, 8] full and cached; [9] partial
    assert cache.block_pool.num_cached_blocks == 2
    a_blocks = cache.block_table("a")
    assert cache.find_cached_blocks(tokens) == a_blocks[:2]
    assert cache.find_cached_blocks([5, 6, 7, 0]) == a_blocks[:1]  # the second block differs
    assert cache.find_cached_blocks([7, 8, 5, 6]) == ()  # a block is named by its whole prefix
    assert cache.add_sequence("b", [5, 6, 7, 8, 9]) == 4  # the partial block is never shared
    assert cache.block_table("b") == a_blocks[:2] and cache.ref_count(a_blocks[0]) == 2
    assert cache.blocks_in_use == 3
    k_b, v_b = random_kv(rng, 1, 1)
    cache.update(["b"], k_b, v_b, token_ids=[[9]])
    k_seq, _, lengths = cache.gather(["b"])
    np.testing.assert_array_equal(k_seq[0, :4], k[0, :4])  # a's keys, never recomputed
    np.testing.assert_array_equal(k_seq[0, 4], k_b[0, 0])
    assert lengths.tolist() == [5]


def test_cached_blocks_outlive_their_sequences_until_evicted():
    rng = np.random.default_rng(36)
    cache = kv.PagedKVCache(3, 2, D_K, D_V, enable_prefix_caching=True)
    cache.add_sequence("a")
    cache.update(["a"], *random_kv(rng, 1, 4), token_ids=[[1, 2, 3, 4]])
    blocks = cache.block_table("a")
    cache.free("a")
    assert cache.blocks_in_use == 0 and cache.num_free_blocks == 3
    assert cache.find_cached_blocks([1, 2, 3, 4, 0]) == blocks  # still cached at refcount 0
    cache.add_sequence("b")
    cache.update(["b"], *random_kv(rng, 1, 4), token_ids=[[7, 7, 7, 7]])  # needs 2: the plain block, then an eviction
    assert cache.find_cached_blocks([1, 2, 3, 4]) == blocks[:1]  # a's last block went first
    assert cache.add_sequence("c", [1, 2, 3, 4]) == 2


def test_without_token_ids_or_without_prefix_caching_nothing_is_cached():
    rng = np.random.default_rng(37)
    plain = kv.PagedKVCache(4, 2, D_K, D_V)
    plain.add_sequence("a")
    plain.update(["a"], *random_kv(rng, 1, 4), token_ids=[[1, 2, 3, 4]])
    assert plain.find_cached_blocks([1, 2, 3, 4]) == () and plain.add_sequence("b", [1, 2, 3, 4]) == 0
    caching = kv.PagedKVCache(6, 2, D_K, D_V, enable_prefix_caching=True)
    caching.add_sequence("a")
    caching.update(["a"], *random_kv(rng, 1, 2), token_ids=[[1, 2]])
    caching.update(["a"], *random_kv(rng, 1, 2))  # no ids: this block and every later one are not cached
    caching.update(["a"], *random_kv(rng, 1, 2), token_ids=[[5, 6]])
    assert caching.block_pool.num_cached_blocks == 1


def test_an_empty_write_without_token_ids_changes_nothing_caching_goes_on():
    rng = np.random.default_rng(38)
    cache = kv.PagedKVCache(6, 2, D_K, D_V, enable_prefix_caching=True)
    cache.add_sequence("a")
    cache.update(["a"], *random_kv(rng, 1, 1), token_ids=[[1]])
    before = snapshot(cache)
    slots = cache.update(["a"], np.zeros((1, 0, D_K)), np.zeros((1, 0, D_V)))  # 0 tokens, no ids: nothing written
    assert slots.shape == (1, 0)
    assert_same_snapshot(before, snapshot(cache))
    cache.update(["a"], *random_kv(rng, 1, 3), token_ids=[[2, 3, 4]])  # blocks [1, 2] and [3, 4] fill
    assert cache.block_pool.num_cached_blocks == 2
    assert cache.find_cached_blocks([1, 2, 3, 4]) == cache.block_table("a")


def test_bad_token_ids_are_refused_and_change_nothing():
    cache = kv.PagedKVCache(4, 2, D_K, D_V, enable_prefix_caching=True)
    cache.add_sequence("a")
    before = snapshot(cache)
    k, v = np.ones((1, 2, D_K)), np.ones((1, 2, D_V))
    with pytest.raises(ValueError, match=r"token_ids must be \[N, T_new\] = \[1, 2\]"):
        cache.update(["a"], k, v, token_ids=[[1, 2, 3]])
    with pytest.raises(TypeError, match="token_ids must be integers, got dtype float64"):
        cache.update(["a"], k, v, token_ids=[[1.0, 2.0]])
    with pytest.raises(TypeError, match="token_ids must be integers"):
        cache.add_sequence("b", ["x"])
    assert_same_snapshot(before, snapshot(cache))


@pytest.mark.parametrize("caching", [False, True])
def test_negative_token_ids_are_refused_naming_the_first_and_change_nothing(caching):
    cache = kv.PagedKVCache(4, 2, D_K, D_V, enable_prefix_caching=caching)
    cache.add_sequence("a")
    cache.update(["a"], np.ones((1, 1, D_K)), np.ones((1, 1, D_V)), token_ids=[[0]])  # 0 is a token id
    before = snapshot(cache)
    with pytest.raises(ValueError, match=r"^token_ids\[0, 0\] = -1 is negative: token ids are integers >= 0$"):
        cache.update(["a"], np.ones((1, 1, D_K)), np.ones((1, 1, D_V)), token_ids=[[-1]])
    with pytest.raises(ValueError, match=r"^token_ids\[0, 1\] = -7 is negative"):
        cache.update(["a"], np.ones((1, 3, D_K)), np.ones((1, 3, D_V)), token_ids=np.array([[3, -7, -1]]))
    with pytest.raises(ValueError, match=r"^token_ids\[2\] = -2 is negative"):
        cache.add_sequence("b", [1, 2, -2])
    with pytest.raises(ValueError, match=r"^token_ids\[0\] = -1 is negative"):
        cache.find_cached_blocks([-1, 0])
    assert_same_snapshot(before, snapshot(cache))


# --- the pool's memory -----------------------------------------------------------------------------


def test_ten_million_blocks_cost_integers_not_python_objects():
    import tracemalloc

    tracemalloc.start()
    try:
        cache = kv.PagedKVCache(10**7, 1, 1, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pool = cache.k_cache.nbytes + cache.v_cache.nbytes  # 160 MB
    # The free queue's links (int32 next and prev) and the refcounts (int32): 120 MB; a list of Python ints
    # took 344 MiB more.
    assert peak - pool <= 10**7 * 12 + 2**20
    assert cache.num_free_blocks == 10**7
    cache.add_sequence(0)
    cache.update([0], np.ones((1, 2, 1)), np.ones((1, 2, 1)))
    assert cache.block_table(0) == (0, 1)


def test_repr_gives_the_pool_and_its_use_not_the_arrays():
    cache = kv.PagedKVCache(num_blocks=1000, block_size=16, k_dim=128, v_dim=64, dtype=np.float32)
    assert repr(cache) == (
        "PagedKVCache(num_blocks=1000, block_size=16, k_dim=128, v_dim=64, dtype=float32, blocks_in_use=0, sequences=0)"
    )
    cache.add_sequence("a")
    cache.add_sequence("b")
    cache.update(["a"], np.ones((1, 33, 128), np.float32), np.ones((1, 33, 64), np.float32))  # ceil(33 / 16) = 3 blocks
    assert repr(cache).endswith("blocks_in_use=3, sequences=2)")


# --- rolled_back_on_error: a failed block puts everything back, a finished one keeps its writes ---------




class _CountedPool(np.ndarray):
    """A pool that adds the bytes of every copy indexing it makes (a fancy index) to ``copied``."""

    copied = 0

    def __getitem__(self, index):
        out = super().__getitem__(index)
        if isinstance(out, np.ndarray) and not np.shares_memory(out, self):
            _CountedPool.copied += out.nbytes
        return out.view(np.ndarray) if isinstance(out, np.ndarray) else out


@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_a_skewed_paged_step_copies_each_stored_token_once(num_kv_heads):
    # 1 sequence at 2,047 tokens and 7 at 61 (block 16: every last block partial), one step: the K/V copied
    # from the pool is the stored tokens' (at most 1.1x), not every table padded to the longest (6.6x before).
    rng = np.random.default_rng(0)
    lengths, heads = [2047] + [61] * 7, () if num_kv_heads is None else (num_kv_heads,)
    pool = kv.PagedKVCache(200, 16, 8, 4, np.float32, num_kv_heads=num_kv_heads)
    ks = [rng.standard_normal((n, *heads, 8)).astype(np.float32) for n in lengths]
    vs = [rng.standard_normal((n, *heads, 4)).astype(np.float32) for n in lengths]
    for i, (k, v) in enumerate(zip(ks, vs)):
        pool.add_sequence(i)
        pool.update([i], k[None], v[None])
    q = rng.standard_normal((8, *(heads and (2 * num_kv_heads,)), 1, 8)).astype(np.float32)
    pool.k_caches[0], pool.v_caches[0] = pool.k_cache.view(_CountedPool), pool.v_cache.view(_CountedPool)
    _CountedPool.copied = 0
    out = kv.paged_attention(q, pool, range(8), check_finite=False)
    stored = sum(lengths) * (pool.k_cache[0, 0].nbytes + pool.v_cache[0, 0].nbytes)
    assert stored <= _CountedPool.copied <= 1.1 * stored, (_CountedPool.copied, stored)
    for i, (k, v) in enumerate(zip(ks, vs)):  # each row against its own keys; query head h reads K/V head h // 2
        k, v = (x if num_kv_heads is None else np.repeat(x.swapaxes(0, 1), 2, axis=0) for x in (k, v))
        np.testing.assert_allclose(out[i], kv.attend(q[i], k, v), rtol=1e-4, atol=1e-5)


def test_paged_attention_equals_attend_over_each_sequences_keys_and_checks_q():
    rng = np.random.default_rng(7)
    cache = kv.PagedKVCache(8, 3, 4, 2)
    lengths = {"a": 7, "b": 0, "c": 3}
    for seq_id, n in lengths.items():
        cache.add_sequence(seq_id)
        cache.update([seq_id], rng.standard_normal((1, n, 4)), rng.standard_normal((1, n, 2)))
    q = rng.standard_normal((3, 2, 4))
    out = kv.paged_attention(q, cache, ["a", "b", "c"])
    k, v, _ = cache.gather(["a", "b", "c"])
    for i, n in enumerate(lengths.values()):
        np.testing.assert_allclose(out[i], kv.attend(q[i], k[i, :n], v[i, :n]), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"q must be \[N=3, T_q, D_k=4\], got shape \(2, 2, 4\)"):
        kv.paged_attention(q[:2], cache, ["a", "b", "c"])


def test_crop_takes_a_write_back_and_a_bad_length_changes_nothing():
    rng = np.random.default_rng(0)
    cache = kv.PagedKVCache(8, 4, D_K, D_V, num_kv_heads=1)  # a view takes a pool with heads
    cache.add_sequence("a")
    cache.add_sequence("b")
    cache.update(["a", "b"], *(x[:, :, None] for x in random_kv(rng, 2, 5)))
    before, gathered = snapshot(cache), cache.gather(["a", "b"])
    cache.update(["a", "b"], *(x[:, :, None] for x in random_kv(rng, 2, 4)))  # positions 5..8: a third block each
    assert cache.num_free_blocks == 2
    cache.crop("a", 5)
    cache.crop("b", 5)
    assert snapshot(cache)[3:6] == before[3:6]  # block tables, lengths, free blocks (the peak stays a peak)
    for was, now in zip(gathered[:2], cache.gather(["a", "b"])[:2]):  # each sequence's 5 tokens (past: its slots)
        np.testing.assert_array_equal(was[:, :5], now[:, :5])
    for bad in (6, -1):
        with pytest.raises((ValueError, TypeError), match="crop length"):
            cache.crop("a", bad)
    view = kv.PagedCacheView(cache, ["a", "b"])
    with pytest.raises(ValueError, match="crop length"):
        view.crop([4, 6])  # b's 6 is refused before a is cropped
    assert [cache.get_seq_length(s) for s in "ab"] == [5, 5]
    view.crop([4, 0])
    assert [cache.get_seq_length(s) for s in "ab"] == [4, 0] and cache.block_table("b") == ()


def test_the_layers_of_a_pool_share_its_block_tables_and_each_keeps_its_own_kv():
    # One block table per sequence, one allocator and one set of hashes for 3 layers, as vLLM V1's KV cache manager.
    rng = np.random.default_rng(3)
    pool = kv.PagedKVCache(6, 2, 3, 2, enable_prefix_caching=True, num_layers=3)
    pool.add_sequence("a")
    slots = pool.append_slots(["a"], 3, token_ids=[[5, 6, 7]])  # 2 blocks, once for every layer
    np.testing.assert_array_equal(slots, [[0, 1, 2]])
    assert pool.get_seq_length("a") == 3 and pool.num_free_blocks == 4 and pool.block_pool.num_cached_blocks == 0
    ks, vs = rng.standard_normal((3, 1, 3, 3)), rng.standard_normal((3, 1, 3, 2))
    for layer in range(3):
        pool.write_slots(layer, slots, ks[layer], vs[layer])
    pool.cache_full_blocks(["a"])  # the full block [5, 6], once every layer has written it
    assert pool.block_pool.num_cached_blocks == 1 and pool.add_sequence("b", [5, 6, 9]) == 2
    q = rng.standard_normal((1, 1, 3))
    for layer in range(3):  # each layer reads its own K/V through the shared table
        np.testing.assert_array_equal(pool.gather(["a"], layer)[0][:, :3], ks[layer])
        np.testing.assert_allclose(kv.paged_attention(q, pool, ["a"], layer=layer), kv.attend(q, ks[layer], vs[layer]),
                                   rtol=1e-12, atol=1e-12)
    assert pool.nbytes == 3 * 3 * (3 + 2) * 8  # a's 3 tokens (b's 2 are a's block, counted once), in every layer
    with pytest.raises(ValueError, match="update writes a pool of one layer, this one has num_layers=3"):
        pool.update(["a"], ks[0], vs[0])
    with pytest.raises(ValueError, match="layer=3 is not a layer of the pool: num_layers=3"):
        pool.write_slots(3, slots, ks[0], vs[0])
    with pytest.raises(ValueError, match="slot_mapping holds a slot outside the pool's 12"):
        pool.write_slots(0, slots + 12, ks[0], vs[0])
    with pytest.raises(ValueError, match="k and v hold T_new=2 positions, slot_mapping 3"):
        pool.write_slots(0, slots, ks[0][:, :2], vs[0][:, :2])
    np.testing.assert_array_equal(pool.gather(["a"], 0)[0][:, :3], ks[0])  # nothing written by a refused call


class _FailsAfterTheLayers(dict):
    """Weights whose final norm raises MemoryError once read: a failure after every layer wrote its K/V."""

    def __getitem__(self, name):
        if name == "model.norm.weight":
            raise MemoryError("the logits do not fit")
        return super().__getitem__(name)


def test_a_generate_through_a_prefix_caching_view_that_fails_after_the_layers_leaves_the_pool_as_it_was():
    # Issue 47: a one-token generate failed with "AssertionError: cached since" and leaked 2 blocks. The pool's
    # checkpoint now undoes the blocks cached since too, and the caller gets its own error.
    config = kv.ModelConfig(vocab_size=61, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                            num_attention_heads=6, num_key_value_heads=2)
    weights = kv.init_weights(config, seed=1, dtype=np.float64)
    pool = kv.PagedKVCache(8, 4, config.head_dim, config.head_dim, enable_prefix_caching=True, num_kv_heads=2,
                           num_layers=2)
    pool.add_sequence(0)
    ids = np.arange(1, 10)[None]  # 9 tokens: 2 full blocks, cached by the forward
    before = (pool.block_pool.free_blocks(), pool.num_free_blocks, pool.block_pool.num_cached_blocks, pool.peak_blocks)
    with pytest.raises(MemoryError, match="the logits do not fit"):
        kv.generate(config, _FailsAfterTheLayers(weights), ids, 1, cache=kv.PagedCacheView(pool, [0], ids))
    assert pool.get_seq_length(0) == 0 and pool.block_table(0) == ()
    assert (pool.block_pool.free_blocks(), pool.num_free_blocks, pool.block_pool.num_cached_blocks,
            pool.peak_blocks) == before
    np.testing.assert_array_equal(kv.generate(config, weights, ids, 1, cache=kv.PagedCacheView(pool, [0], ids)),
                                  kv.generate(config, weights, ids, 1))


def test_a_restore_gives_back_the_tokens_a_crop_inside_a_block_let_a_write_go_over():
    """Hypothesis found it: crop to 1 of a block of 2, write 1 token there, restore: the cropped token is back."""
    cache = kv.PagedKVCache(1, 2, D_K, D_V)
    cache.add_sequence("a")
    k, v = np.arange(2.0 * D_K).reshape(1, 2, D_K), np.arange(2.0 * D_V).reshape(1, 2, D_V)
    cache.update(["a"], k, v)
    checkpoint = cache.checkpoint()
    cache.crop("a", 1)
    cache.update(["a"], np.full((1, 1, D_K), -1.0), np.full((1, 1, D_V), -1.0))
    cache.restore(checkpoint)
    k_seq, v_seq, lengths = cache.gather(["a"])
    assert lengths.tolist() == [2]
    np.testing.assert_array_equal(k_seq, k)
    np.testing.assert_array_equal(v_seq, v)


@pytest.mark.parametrize("caching", [False, True])
def test_a_checkpoint_costs_what_the_calls_after_it_touch_not_the_sequences_length(caching):
    """The undo recorded for one more token, counted: the same at 16 and at 4,096 tokens held; a block taken
    records a copy of that block, nothing more."""
    recorded = {}
    for length in (16, 4096):
        cache = kv.PagedKVCache(300, 16, D_K, D_V, enable_prefix_caching=caching)
        cache.add_sequence("a")
        cache.update(["a"], np.ones((1, length, D_K)), np.ones((1, length, D_V)), token_ids=np.ones((1, length), int))
        checkpoint = cache.checkpoint()
        cache.update(["a"], np.ones((1, 1, D_K)), np.ones((1, 1, D_V)), token_ids=[[2]])  # takes a block
        undo = cache.journal._undo
        saved = [a.nbytes for _, args in undo for arg in args if isinstance(arg, list) for a in arg
                 if isinstance(a, np.ndarray)]
        recorded[length] = (len(undo), saved)
        cache.restore(checkpoint)
        assert cache.get_seq_length("a") == length and cache.blocks_in_use == length // 16
    assert recorded[16] == recorded[4096] and recorded[16][1] == [16 * D_K * 8, 16 * D_V * 8]
    assert recorded[16][0] <= 6  # the table, the free queue, the block, its refcount, the peak (and the hashes)
