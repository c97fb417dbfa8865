"""The block allocators: the LIFO free list, refcounts, double frees, and the prefix cache's hashes and LRU eviction.

Expectations are written out here: the free list's order by hand, the block hash
by hashlib on the bytes it is defined over.
"""

import hashlib

import numpy as np
import pytest

import kv_attention as kv
from kv_attention.block_allocator import BlockAllocator
from kv_attention.prefix_caching import PrefixCachingAllocator, hash_block_tokens


@pytest.fixture(params=[BlockAllocator, PrefixCachingAllocator])
def allocator_class(request):
    return request.param


def test_the_free_list_is_lifo_from_the_last_block(allocator_class):
    allocator = allocator_class(5)
    assert allocator.free_blocks() == (4, 3, 2, 1, 0)
    assert allocator.allocate(2) == [4, 3]
    allocator.free([4, 3])
    assert allocator.free_blocks() == (4, 3, 2, 1, 0)  # blocks[0] back on top
    assert allocator.allocate(3) == [4, 3, 2]
    allocator.free([3])
    assert allocator.allocate(1) == [3]  # a freed block is the next one taken


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


def test_the_free_list_is_an_integer_array_not_python_objects():
    allocator = BlockAllocator(1000)
    assert isinstance(allocator._free, np.ndarray) and allocator._free.dtype == np.int32


def test_hash_block_tokens_is_sha256_of_the_parent_hash_and_the_tokens():
    first = hashlib.sha256(np.array([3, 1, 4], "<i8").tobytes()).digest()
    second = hashlib.sha256(first + np.array([1, 5, 9], "<i8").tobytes()).digest()
    assert hash_block_tokens(None, [3, 1, 4]) == first
    assert hash_block_tokens(first, np.array([1, 5, 9], np.int32)) == second
    assert hash_block_tokens(None, [1, 5, 9]) != second  # the same tokens after another prefix differ


def test_cached_blocks_stay_findable_at_refcount_zero_and_are_taken_back():
    allocator = PrefixCachingAllocator(4)
    a, b = allocator.allocate(2)
    assert allocator.cache(a, b"h-a") and allocator.cache(b, b"h-b")
    allocator.free([a, b])
    assert allocator.num_free_blocks == 4 and allocator.lookup(b"h-a") == a and allocator.num_cached_blocks == 2
    allocator.share([a])  # a hit: back from the evictable list
    assert allocator.ref_count(a) == 1 and allocator.num_free_blocks == 3
    assert a not in allocator.free_blocks() and b in allocator.free_blocks()


def test_a_new_block_comes_from_the_plain_free_list_before_any_cached_block_is_evicted():
    allocator = PrefixCachingAllocator(4)  # plain free list 3, 2, 1, 0
    a, b = allocator.allocate(2)  # 3, 2
    allocator.cache(a, b"h-a")
    allocator.free([a, b])  # b plain, a cached
    assert allocator.free_blocks() == (2, 1, 0, 3)
    assert allocator.allocate(3) == [2, 1, 0] and allocator.lookup(b"h-a") == a
    assert allocator.allocate(1) == [a] and allocator.lookup(b"h-a") is None  # evicted: its hash is gone


def test_eviction_is_least_recently_freed_first_and_the_tail_of_a_sequence_first():
    allocator = PrefixCachingAllocator(4)
    first = allocator.allocate(2)  # one sequence's blocks 3, 2
    second = allocator.allocate(2)  # another's: 1, 0
    for block in first + second:
        allocator.cache(block, f"h{block}".encode())
    allocator.free(first)  # freed earlier: evicted first, its last block (2) before its first (3)
    allocator.free(second)
    assert allocator.allocate(4) == [2, 3, 0, 1]
    assert all(allocator.lookup(f"h{b}".encode()) is None for b in range(4))


def test_a_stale_hash_never_survives_the_reuse_of_its_block():
    allocator = PrefixCachingAllocator(1)
    (a,) = allocator.allocate(1)
    allocator.cache(a, b"old prefix")
    allocator.free([a])
    (again,) = allocator.allocate(1)  # the only block, evicted and reused
    assert again == a and allocator.lookup(b"old prefix") is None
    assert allocator.cache(a, b"new prefix") and allocator.lookup(b"new prefix") == a


def test_a_hash_or_a_block_is_cached_once():
    allocator = PrefixCachingAllocator(3)
    a, b = allocator.allocate(2)
    assert allocator.cache(a, b"h")
    assert not allocator.cache(b, b"h")  # the first block of a hash stays; the duplicate is not cached
    assert not allocator.cache(a, b"other")
    allocator.free([b])
    assert allocator.free_blocks()[0] == b  # uncached: back on the plain free list
    with pytest.raises(ValueError, match="cannot cache block"):
        allocator.cache(b, b"h2")


# --- the invariants are asserted where vLLM asserts them: state corrupted by hand trips them ---------


def test_a_free_block_that_is_held_trips_the_allocate_assert(allocator_class):
    allocator = allocator_class(3)
    allocator._ref_counts[2] = 1  # block 2, the top of the free list, corrupted into "held"
    with pytest.raises(AssertionError, match=r"a block taken from the free list is held: \[2\]"):
        allocator.allocate(1)


def test_putting_a_held_block_on_the_free_list_trips_the_release_assert(allocator_class):
    allocator = allocator_class(3)
    (block,) = allocator.allocate(1)
    with pytest.raises(AssertionError, match="a block put back on the free list is held"):
        allocator._release([block])  # what free() must never do: the block still has refcount 1


def test_a_free_list_of_more_than_num_blocks_trips_the_duplicate_assert():
    allocator = BlockAllocator(2)
    allocator._ref_counts[:] = 0  # every block free, and already on the free list
    with pytest.raises(AssertionError, match="the free list would hold a block twice"):
        allocator._release([0])


def test_an_evicted_block_that_is_held_trips_the_evict_assert():
    allocator = PrefixCachingAllocator(1)
    (block,) = allocator.allocate(1)
    allocator.cache(block, b"h")
    allocator.free([block])  # cached, refcount 0: evictable
    allocator._ref_counts[block] = 1  # corrupted
    with pytest.raises(AssertionError, match=f"evictable block {block} is held"):
        allocator.allocate(1)


def test_a_block_table_entry_that_is_not_held_trips_the_paged_assert(monkeypatch):
    cache = kv.PagedKVCache(4, 2, 3, 5)
    cache.add_sequence("a")
    monkeypatch.setattr(cache.allocator, "allocate", lambda n: [0] * n)  # hands out block 0, refcount 0
    with pytest.raises(AssertionError, match="a new block table entry is not held"):
        cache.update(["a"], np.zeros((1, 1, 3)), np.zeros((1, 1, 5)))
