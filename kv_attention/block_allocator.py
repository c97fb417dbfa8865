"""The physical blocks of a paged pool: vLLM V1's free block queue and a refcount per block.

A block's refcount is the number of block tables holding it: ``allocate`` takes
blocks from the head of the free queue at refcount 1, ``share`` adds a holder (a
fork, or a prefix-cache hit, which takes a free cached block out of the queue),
``free`` removes one, and a block goes back on the queue when its last holder
lets go. What matches vLLM V1 (``vllm/v1/core/kv_cache_utils.py``:
``FreeKVCacheBlockQueue``; ``vllm/v1/core/block_pool.py``: ``get_new_blocks``,
``touch``, ``free_blocks``): a doubly linked queue with a fake head and tail, in
block id order when the pool is new; ``free`` takes blocks in eviction order (the
cache frees a sequence's table tail first, as ``single_type_kv_cache_manager.py``'s
``free`` does), puts those with no hash at the head (``prepend_n``: taken next) and
cached ones at the tail (``append_n``: evicted last); invariants are ``assert``s.
What differs: the queue's links are two integer arrays, not Python objects; no
block 0 is set aside as V1's ``null_block`` (no sliding window here needs one);
a double free is a ValueError, not a silently negative refcount.

Errors: TypeError for a block id that is not an integer; ValueError for one out of
range, repeated in one call, or not held; :class:`OutOfBlocksError` for more blocks
than are free. A call that raises changes nothing; :meth:`~BlockAllocator.checkpoint` and
:meth:`~BlockAllocator.restore` undo an allocation whose caller failed later.
"""

import itertools

import numpy as np

from ._validation import as_size
from .cache import CacheFullError


class OutOfBlocksError(CacheFullError, RuntimeError):
    """The pool has fewer free blocks than an update needs; the cache was left unchanged."""


def index_dtype(num_blocks):
    """The smallest of int32 and int64 that numbers ``num_blocks`` blocks."""
    return np.dtype(np.int32 if num_blocks <= np.iinfo(np.int32).max else np.int64)


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order, the head taken first: V1's doubly linked list of the same name.

    Blocks ``0 .. n - 1`` link through ``_next``/``_prev``; ``n`` is the fake head and
    ``n + 1`` the fake tail, so that no operation branches on an empty queue.
    """

    def __init__(self, num_blocks):
        n, dtype = num_blocks, index_dtype(num_blocks + 2)
        self._head, self._tail, self.num_free_blocks = n, n + 1, n
        self._next = np.arange(1, n + 3, dtype=dtype)  # block i -> i + 1: id order
        self._prev = np.arange(-1, n + 1, dtype=dtype)  # block i <- i - 1
        self._next[self._head] = 0 if n else self._tail
        self._prev[self._tail] = n - 1 if n else self._head
        if n:
            self._next[n - 1], self._prev[0] = self._tail, self._head

    def popleft_n(self, n):
        """Take ``n`` blocks off the head (a list, in order)."""
        assert n <= self.num_free_blocks, f"{n} blocks taken from a queue of {self.num_free_blocks}"
        blocks = []
        for _ in range(n):
            blocks.append(int(self._next[self._head]))
            self.remove(blocks[-1])
        return blocks

    def remove(self, block):
        """Unlink ``block`` from wherever it is in the queue (a prefix-cache hit, V1's ``touch``)."""
        before, after = self._prev[block], self._next[block]
        self._next[before], self._prev[after] = after, before
        self.num_free_blocks -= 1

    def append_n(self, blocks):
        """Put ``blocks`` at the tail, in order (the last evicted last)."""
        for block in blocks:
            last = self._prev[self._tail]
            self._next[last], self._prev[block] = block, last
            self._next[block], self._prev[self._tail] = self._tail, block
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks):
        """Put ``blocks`` at the head, in order (``blocks[0]`` taken first)."""
        for block in reversed(blocks):
            first = self._next[self._head]
            self._next[self._head], self._prev[block] = block, self._head
            self._next[block], self._prev[first] = first, block
        self.num_free_blocks += len(blocks)

    def __iter__(self):
        """The free blocks, head first (V1's ``get_all_free_blocks``)."""
        block = int(self._next[self._head])
        while block != self._tail:
            yield block
            block = int(self._next[block])


class BlockAllocator:
    """Blocks ``0 .. num_blocks - 1``: V1's free queue and a refcount each (``int32``)."""

    def __init__(self, num_blocks):
        num_blocks = as_size("num_blocks", num_blocks)
        self._free = FreeKVCacheBlockQueue(num_blocks)
        self._ref_counts = np.zeros(num_blocks, dtype=np.int32)

    @property
    def num_blocks(self):
        """Blocks in the pool (int)."""
        return len(self._ref_counts)

    @property
    def num_free_blocks(self):
        """Blocks that :meth:`allocate` can take (int)."""
        return self._free.num_free_blocks

    def ref_count(self, block):
        """Block tables holding ``block`` (int); 0 for a free block."""
        return int(self._ref_counts[self._check_block_id(block)])

    def free_blocks(self, n=None):
        """The free blocks, the next one taken first: all, or the first ``n`` (tuple of ints)."""
        return tuple(itertools.islice(self._free, n))

    def is_cached(self, block):
        """Whether ``block`` is cached under a hash (bool; never, without prefix caching)."""
        return False

    def allocate(self, n):
        """Take ``n`` blocks off the head of the free queue, each with refcount 1: a list, in the order taken."""
        n = as_size("n", n)
        if n > self.num_free_blocks:
            raise OutOfBlocksError(f"out of blocks: {n} needed, {self.num_free_blocks} of {self.num_blocks} free")
        blocks = self._free.popleft_n(n)
        assert not self._ref_counts[blocks].any(), f"a block taken from the free list is held: {blocks}"
        self._evict(blocks)
        self._ref_counts[blocks] = 1
        return blocks

    def share(self, blocks):
        """Add one holder to each of ``blocks`` (distinct, each held; with prefix caching, or free and cached)."""
        blocks = self._check_held(blocks, "share")
        for block in blocks:
            if self._ref_counts[block] == 0:  # a free cached block: a hit takes it out of the queue
                self._free.remove(block)
        self._ref_counts[blocks] += 1

    def free(self, blocks):
        """Remove one holder from each of ``blocks``, given in eviction order (the first evicted first); return
        those left with none: the uncached ones go to the head of the free queue, the cached ones to its tail."""
        blocks = self._check_held(blocks, "free")
        self._ref_counts[blocks] -= 1
        assert (self._ref_counts[blocks] >= 0).all(), f"a refcount went below 0: {blocks}"
        released = [b for b in blocks if self._ref_counts[b] == 0]
        self._release(released)
        return released

    def checkpoint(self, n):
        """What taking up to the next ``n`` blocks changes, for :meth:`restore`: those blocks (a tuple)."""
        return self.free_blocks(n)

    def restore(self, taken):
        """Put the blocks of ``taken`` (a :meth:`checkpoint`) allocated since, its first ones, each held once, back
        at the head of the free queue as they were: the undo of a call that failed after it allocated (its caller
        undoes any share or free)."""
        held = [b for b in taken if self._ref_counts[b]]
        assert held == list(taken[: len(held)]) and (self._ref_counts[held] == 1).all(), f"not as taken: {taken}"
        self._ref_counts[held] = 0
        self._free.prepend_n(held)

    def _release(self, blocks):
        assert not self._ref_counts[blocks].any(), f"a block put back on the free list is held: {blocks}"
        assert self.num_free_blocks + len(blocks) <= self.num_blocks, "the free list would hold a block twice"
        self._free.prepend_n([b for b in blocks if not self.is_cached(b)])
        self._free.append_n([b for b in blocks if self.is_cached(b)])

    def _evict(self, blocks):
        """Drop the hashes of ``blocks``, just taken off the queue (prefix caching)."""

    def _check_block_id(self, block):
        """``block`` as an int in [0, num_blocks); TypeError unless an integer, ValueError out of range."""
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
            raise TypeError(f"a block id must be an integer, got {block!r}")
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} is out of range: the pool has blocks 0..{self.num_blocks - 1}")
        return int(block)

    def _check_held(self, blocks, action):
        """``blocks`` as a list of distinct ints in range, each held (refcount >= 1), or free and cached for share."""
        blocks = [self._check_block_id(block) for block in blocks]
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks repeat a block: {blocks}")
        for block in blocks:
            if self._ref_counts[block] < 1 and not (action == "share" and self.is_cached(block)):
                what = "Double free! " if action == "free" else ""
                raise ValueError(f"{what}cannot {action} block {block}: it is free (refcount 0)")
        return blocks
