"""The block pool: vLLM V1's free queue, refcounts, double frees, and the prefix cache's hashes and eviction.

Expectations are written out here: the free queue's order by hand (as V1's
``block_pool.py`` and ``FreeKVCacheBlockQueue`` order it), the block hash by hashlib
on the bytes it is defined over.
"""

import hashlib

import numpy as np
import pytest

import kv_attention as kv
from kv_attention.block_allocator import BlockPool, hash_block_tokens


def caching_pool(num_blocks):
    return BlockPool(num_blocks, enable_caching=True)


@pytest.fixture(params=[BlockPool, caching_pool], ids=["no caching", "caching"])
def allocator_class(request):
    return request.param


def test_a_new_pool_hands_out_blocks_in_id_order_and_a_freed_block_without_hash_is_taken_next(allocator_class):
    allocator = allocator_class(5)
    assert allocator.free_blocks() == (0, 1, 2, 3, 4)
    assert allocator.allocate(2) == [0, 1]
    allocator.free([1, 0])  # a table freed tail first, as V1's free: both to the head, in that order
    assert allocator.free_blocks() == (1, 0, 2, 3, 4)
    assert allocator.allocate(3) == [1, 0, 2]
    allocator.free([0])
    assert allocator.allocate(1) == [0]  # a freed block is the next one taken


def test_refcounts_count_holders_and_a_block_is_freed_once_at_zero(allocator_class):
    allocator = allocator_class(4)
    a, b = allocator.allocate(2)
    allocator.share([a])
    allocator.share([a])
    assert (allocator.ref_count(a), allocator.ref_count(b)) == (3, 1)
    assert allocator.free([a, b]) == [b]  # only b reached 0
    assert allocator.num_free_blocks == 3 and allocator.ref_count(a) == 2
    assert allocator.free([a]) == [] and allocator.free([a]) == [a]
    assert allocator.num_free_blocks == 4 and sorted(allocator.free_blocks()) == [0, 1, 2, 3]


def test_a_double_free_and_a_share_of_a_free_block_are_refused_and_change_nothing(allocator_class):
    allocator = allocator_class(3)
    (a,) = allocator.allocate(1)
    allocator.free([a])
    before = allocator.free_blocks()
    with pytest.raises(ValueError, match=f"Double free! cannot free block {a}: it is free"):
        allocator.free([a])
    with pytest.raises(ValueError, match=f"cannot share block {a}: it is free"):
        allocator.share([a])
    (b,) = allocator.allocate(1)
    with pytest.raises(ValueError, match="blocks repeat a block"):
        allocator.free([b, b])
    with pytest.raises(ValueError, match="block 7 is out of range"):
        allocator.free([b, 7])
    with pytest.raises(TypeError, match="a block id must be an integer"):
        allocator.ref_count(1.0)
    assert allocator.ref_count(b) == 1 and allocator.free_blocks() == before[1:]


def test_allocating_more_than_is_free_raises_out_of_blocks_and_takes_none(allocator_class):
    allocator = allocator_class(3)
    allocator.allocate(2)
    with pytest.raises(kv.OutOfBlocksError, match="2 needed, 1 of 3 free"):
        allocator.allocate(2)
    assert allocator.num_free_blocks == 1


def test_the_free_queue_is_integer_arrays_not_python_objects():
    allocator = BlockPool(1000)
    queue = allocator._free
    assert queue._next.dtype == queue._prev.dtype == np.int32 and queue._next.shape == (1002,)


def test_hash_block_tokens_is_sha256_of_the_parent_hash_and_the_tokens():
    first = hashlib.sha256(np.array([3, 1, 4], "<i8").tobytes()).digest()
    second = hashlib.sha256(first + np.array([1, 5, 9], "<i8").tobytes()).digest()
    assert hash_block_tokens(None, [3, 1, 4]) == first
    assert hash_block_tokens(first, np.array([1, 5, 9], np.int32)) == second
    assert hash_block_tokens(None, [1, 5, 9]) != second  # the same tokens after another prefix differ


def test_cached_blocks_stay_findable_at_refcount_zero_and_a_hit_takes_one_out_of_the_queue():
    allocator = caching_pool(4)
    a, b = allocator.allocate(2)  # 0, 1
    allocator.cache(a, b"h-a")
    allocator.cache(b, b"h-b")
    allocator.free([b, a])
    assert allocator.num_free_blocks == 4 and allocator.lookup(b"h-a") == a and allocator.num_cached_blocks == 2
    assert allocator.free_blocks() == (2, 3, b, a)  # cached: to the tail, in the order freed
    allocator.share([a])  # a hit: out of the queue
    assert allocator.ref_count(a) == 1 and allocator.num_free_blocks == 3 and allocator.free_blocks() == (2, 3, b)


def test_freed_blocks_without_hash_go_to_the_head_and_cached_ones_to_the_tail():
    # V1's free_blocks: prepend_n of the blocks with no hash, append_n of the cached ones.
    allocator = caching_pool(6)
    table = allocator.allocate(4)  # 0, 1, 2, 3
    allocator.cache(0, b"h0")
    allocator.cache(1, b"h1")
    allocator.free(table[::-1])  # tail first: 3, 2 uncached; 1, 0 cached
    assert allocator.free_blocks() == (3, 2, 4, 5, 1, 0)
    assert allocator.allocate(4) == [3, 2, 4, 5] and allocator.lookup(b"h1") == 1  # no cached block evicted yet
    assert allocator.allocate(1) == [1] and allocator.lookup(b"h1") is None  # then the queue's head: evicted
    assert allocator.lookup(b"h0") == 0


def test_eviction_is_least_recently_freed_first_and_the_tail_of_a_sequence_first():
    allocator = caching_pool(4)
    first = allocator.allocate(2)  # one sequence's blocks 0, 1
    second = allocator.allocate(2)  # another's: 2, 3
    for block in first + second:
        allocator.cache(block, f"h{block}".encode())
    allocator.free(first[::-1])  # freed earlier: evicted first, its last block (1) before its first (0)
    allocator.free(second[::-1])
    assert allocator.allocate(4) == [1, 0, 3, 2]
    assert all(allocator.lookup(f"h{b}".encode()) is None for b in range(4))


def test_a_stale_hash_never_survives_the_reuse_of_its_block():
    allocator = caching_pool(1)
    (a,) = allocator.allocate(1)
    allocator.cache(a, b"old prefix")
    allocator.free([a])
    (again,) = allocator.allocate(1)  # the only block, evicted and reused
    assert again == a and allocator.lookup(b"old prefix") is None
    allocator.cache(a, b"new prefix")
    assert allocator.lookup(b"new prefix") == a


def test_a_block_whose_hash_is_cached_is_cached_as_well_and_a_lookup_gives_the_first():
    # V1 does not de-duplicate ("block tables are append-only"): both blocks are cached under h.
    allocator = caching_pool(3)
    a, b = allocator.allocate(2)
    allocator.cache(a, b"h")
    allocator.cache(b, b"h")
    assert allocator.num_cached_blocks == 2 and allocator.lookup(b"h") == a
    allocator.free([a])
    assert allocator.free_blocks() == (2, a)  # cached: to the tail
    allocator.allocate(2)  # 2, then a: evicted, and b is what h names now
    assert allocator.lookup(b"h") == b
    with pytest.raises(ValueError, match="cannot cache block 1: it is cached already"):
        allocator.cache(b, b"h2")
    allocator.free([b])
    with pytest.raises(ValueError, match="cannot cache block 1: it is free"):
        allocator.cache(b, b"h2")


# --- the invariants are asserted where vLLM asserts them: state corrupted by hand trips them ---------


def test_a_free_block_that_is_held_trips_the_allocate_assert(allocator_class):
    allocator = allocator_class(3)
    allocator._ref_counts[0] = 1  # block 0, the head of the free queue, corrupted into "held"
    with pytest.raises(AssertionError, match=r"a block taken from the free list is held: \[0\]"):
        allocator.allocate(1)


def test_putting_a_held_block_on_the_free_list_trips_the_release_assert(allocator_class):
    allocator = allocator_class(3)
    (block,) = allocator.allocate(1)
    with pytest.raises(AssertionError, match="a block put back on the free list is held"):
        allocator._release([block])  # what free() must never do: the block still has refcount 1


def test_a_free_list_of_more_than_num_blocks_trips_the_duplicate_assert():
    allocator = BlockPool(2)
    allocator._ref_counts[:] = 0  # every block free, and already on the free list
    with pytest.raises(AssertionError, match="the free list would hold a block twice"):
        allocator._release([0])


def test_a_block_table_entry_that_is_not_held_trips_the_paged_assert(monkeypatch):
    cache = kv.PagedKVCache(4, 2, 3, 5)
    cache.add_sequence("a")
    monkeypatch.setattr(cache.block_pool, "allocate", lambda n: [0] * n)  # hands out block 0, refcount 0
    with pytest.raises(AssertionError, match="a new block table entry is not held"):
        cache.update(["a"], np.zeros((1, 1, 3)), np.zeros((1, 1, 5)))
