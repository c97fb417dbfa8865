"""The physical blocks of a paged pool: a LIFO free list and a refcount per block, as vLLM's block pool.

A block's refcount is the number of block tables holding it: ``allocate`` takes
free blocks at refcount 1, ``share`` adds a holder (a fork, vLLM's
``RefCounter.incr``), ``free`` removes one, and a block returns to the free list
when its last holder lets go. What matches vLLM (``vllm/core/block/naive_block.py``,
``vllm/v1/core/block_pool.py``): the allocator is a class of its own beside the
block tables, a freed block is the next one taken, invariants are ``assert``s and a
double free is a ValueError ("Double free!"). What differs: the free list is a
numpy stack rather than V1's doubly linked ``FreeKVCacheBlockQueue``.

Errors: TypeError for a block id that is not an integer; ValueError for one out of
range, repeated in one call, or not held; :class:`OutOfBlocksError` for more blocks
than are free. A call that raises changes nothing.
"""

import numpy as np

from ._validation import as_size
from .cache import CacheFullError


class OutOfBlocksError(CacheFullError, RuntimeError):
    """The pool has fewer free blocks than an update needs; the cache was left unchanged."""


def index_dtype(num_blocks):
    """The smallest of int32 and int64 that numbers ``num_blocks`` blocks."""
    return np.dtype(np.int32 if num_blocks <= np.iinfo(np.int32).max else np.int64)


class BlockAllocator:
    """Blocks ``0 .. num_blocks - 1``: a LIFO free list and a refcount each (``int32``)."""

    def __init__(self, num_blocks):
        num_blocks = as_size("num_blocks", num_blocks)
        self._free = np.arange(num_blocks, dtype=index_dtype(num_blocks))  # a stack: _free[:_num_free], top taken first
        self._num_free = num_blocks
        self._ref_counts = np.zeros(num_blocks, dtype=np.int32)

    @property
    def num_blocks(self):
        """Blocks in the pool (int)."""
        return len(self._ref_counts)

    @property
    def num_free_blocks(self):
        """Blocks that :meth:`allocate` can take (int)."""
        return self._num_free

    def ref_count(self, block):
        """Block tables holding ``block`` (int); 0 for a free block."""
        return int(self._ref_counts[self._check_block_id(block)])

    def free_blocks(self):
        """The free blocks, the next one taken first (tuple of ints)."""
        return tuple(self._free[: self._num_free][::-1].tolist())

    def allocate(self, n):
        """Take ``n`` free blocks, each with refcount 1: a list, in the order taken."""
        n = as_size("n", n)
        if n > self.num_free_blocks:
            raise OutOfBlocksError(f"out of blocks: {n} needed, {self.num_free_blocks} of {self.num_blocks} free")
        blocks = self._take(n)
        assert not self._ref_counts[blocks].any(), f"a block taken from the free list is held: {blocks}"
        self._ref_counts[blocks] = 1
        return blocks

    def share(self, blocks):
        """Add one holder to each of ``blocks`` (distinct, each held)."""
        blocks = self._check_held(blocks, "share")
        self._ref_counts[blocks] += 1

    def free(self, blocks):
        """Remove one holder from each of ``blocks``; return those left with none, back on the free list
        in reverse, so a sequence freed and re-made gets its blocks back in the same order."""
        blocks = self._check_held(blocks, "free")
        self._ref_counts[blocks] -= 1
        assert (self._ref_counts[blocks] >= 0).all(), f"a refcount went below 0: {blocks}"
        released = [b for b in reversed(blocks) if self._ref_counts[b] == 0]
        self._release(released)
        return released[::-1]

    def _check_block_id(self, block):
        """``block`` as an int in [0, num_blocks); TypeError unless an integer, ValueError out of range."""
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
            raise TypeError(f"a block id must be an integer, got {block!r}")
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} is out of range: the pool has blocks 0..{self.num_blocks - 1}")
        return int(block)

    def _check_held(self, blocks, action, cached=()):
        """``blocks`` as a list of distinct ints in range, each held (refcount >= 1) or in ``cached``."""
        blocks = [self._check_block_id(block) for block in blocks]
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks repeat a block: {blocks}")
        for block in blocks:
            if self._ref_counts[block] < 1 and block not in cached:
                what = "Double free! " if action == "free" else ""
                raise ValueError(f"{what}cannot {action} block {block}: it is free (refcount 0)")
        return blocks

    def _take(self, n):
        """Pop ``n`` blocks off the stack, the top first."""
        top = self._num_free
        self._num_free = top - n
        return self._free[top - n : top][::-1].tolist()

    def _release(self, blocks):
        """Push ``blocks`` (refcount 0) onto the stack, the last one on top."""
        assert not self._ref_counts[blocks].any(), f"a block put back on the free list is held: {blocks}"
        assert self._num_free + len(blocks) <= self.num_blocks, "the free list would hold a block twice"
        self._free[self._num_free : self._num_free + len(blocks)] = blocks
        self._num_free += len(blocks)
