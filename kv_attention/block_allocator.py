"""The physical blocks of a paged pool: vLLM V1's ``BlockPool``, its free block queue, refcounts and prefix-cache hashes.

A block's refcount is the number of block tables holding it; one with none is on the free queue. With
``enable_caching`` a full block is cached under :func:`hash_block_tokens` of its parent's hash and its tokens, and
stays findable on the queue until taken. As vLLM V1 (``vllm/v1/core/block_pool.py``, ``kv_cache_utils.py``'s
``FreeKVCacheBlockQueue`` and ``hash_block_tokens``): a doubly linked queue with a fake head and tail, in block id
order when new; ``free`` takes blocks in eviction order and puts uncached ones at the head (taken next), cached ones
at the tail (evicted last); chained sha256 hashes, a lookup giving the first cached. What differs: the links are two
integer arrays; no ``null_block``, extra hash keys or KV cache groups; a double free is a ValueError; and a
:class:`Journal` undoes every change (V1 never rolls back).

Errors: TypeError for a block id that is not an integer; ValueError for one out of range, repeated in one call, or
not held; :class:`OutOfBlocksError` for more blocks than are free. A call that raises changes nothing.
"""

import hashlib
import weakref

import numpy as np

from ._validation import as_size
from .cache import CacheFullError


class OutOfBlocksError(CacheFullError, RuntimeError):
    """The pool has fewer free blocks than an update needs; the cache was left unchanged."""


def hash_block_tokens(parent_hash, block_token_ids):
    """The hash of a full block: sha256 of its parent's hash (None for the first block) and its token ids (bytes)."""
    tokens = np.ascontiguousarray(block_token_ids, dtype="<i8")
    return hashlib.sha256((parent_hash or b"") + tokens.tobytes()).digest()


class Checkpoint:
    """A point of a :class:`Journal` to go back to; the journal records while one is alive."""

    __slots__ = ("journal", "mark", "__weakref__")

    def __init__(self, journal, mark):
        self.journal, self.mark = journal, mark


class Journal:
    """An undo log of the changes since the oldest live :class:`Checkpoint`: a change records its inverse only while
    one lives, so a checkpoint costs what the changes after it touch (a few ints a block, the K/V of each block
    taken), not the pool's size."""

    def __init__(self):
        self._undo, self._start, self._live = [], 0, weakref.WeakSet()

    recording = property(lambda self: bool(self._live))

    def record(self, undo, *args):
        """Note that ``undo(*args)`` takes back the change about to be made."""
        if self._live:
            self._undo.append((undo, args))

    def checkpoint(self):
        oldest = min((c.mark for c in self._live), default=self._start + len(self._undo))
        del self._undo[: oldest - self._start]
        self._start = oldest
        checkpoint = Checkpoint(self, self._start + len(self._undo))
        self._live.add(checkpoint)
        return checkpoint

    def restore(self, checkpoint):
        """Undo every change made since ``checkpoint``, the last first; the undoing records nothing."""
        if not isinstance(checkpoint, Checkpoint) or checkpoint.journal is not self:
            raise TypeError(f"checkpoint must be a checkpoint of this pool, got {checkpoint!r:.100}")
        live, self._live = self._live, weakref.WeakSet()
        try:
            while self._start + len(self._undo) > checkpoint.mark:
                undo, args = self._undo.pop()
                undo(*args)
        finally:
            self._live = live


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order, the head taken first (V1's doubly linked list): blocks ``0 .. n - 1`` link
    through ``_next``/``_prev``, ``n`` the fake head and ``n + 1`` the fake tail, so no operation branches on empty."""

    def __init__(self, num_blocks, journal):
        n, dtype = num_blocks, np.int32 if num_blocks + 2 <= np.iinfo(np.int32).max else np.int64
        self._head, self._tail, self.num_free_blocks, self.journal = n, n + 1, n, journal
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
        if self.journal.recording:
            self.journal.record(self._insert, block, int(self._prev[block]), int(self._next[block]))
        self._unlink(block)

    def append_n(self, blocks):
        """Put ``blocks`` at the tail, in order (the last evicted last)."""
        for block in blocks:
            self._insert(block, int(self._prev[self._tail]), self._tail)

    def prepend_n(self, blocks):
        """Put ``blocks`` at the head, in order (``blocks[0]`` taken first)."""
        for block in reversed(blocks):
            self._insert(block, self._head, int(self._next[self._head]))

    def _insert(self, block, before, after):
        self.journal.record(self._unlink, block)
        self._next[before], self._prev[block], self._next[block], self._prev[after] = block, before, after, block
        self.num_free_blocks += 1

    def _unlink(self, block):
        before, after = self._prev[block], self._next[block]
        self._next[before], self._prev[after] = after, before
        self.num_free_blocks -= 1

    def __iter__(self):
        """The free blocks, head first (V1's ``get_all_free_blocks``)."""
        block = int(self._next[self._head])
        while block != self._tail:
            yield block
            block = int(self._next[block])


class BlockPool:
    """Blocks ``0 .. num_blocks - 1``: V1's free queue, a refcount each (``int32``), and with ``enable_caching`` the
    hashes of the cached blocks. ``on_take(block)``, if given, runs for each block taken while the journal records:
    before it is written over, for a restore to give back what it held (a cached prefix, or tokens freed since)."""

    def __init__(self, num_blocks, enable_caching=False, on_take=None):
        num_blocks = as_size("num_blocks", num_blocks)
        self.enable_caching, self.on_take, self.journal = enable_caching, on_take, Journal()
        self._free = FreeKVCacheBlockQueue(num_blocks, self.journal)
        self._ref_counts = np.zeros(num_blocks, dtype=np.int32)
        self._blocks_of_hash = {}  # block hash -> {block: None}, the first cached first
        self._hash_of_block = {}  # cached block -> its hash

    num_blocks = property(lambda self: len(self._ref_counts), doc="Blocks in the pool (int).")
    num_free_blocks = property(lambda self: self._free.num_free_blocks,
                               doc="Blocks that :meth:`allocate` can take (int), cached ones nobody holds included.")
    num_cached_blocks = property(lambda self: len(self._hash_of_block), doc="Blocks cached, held or free (int).")

    def ref_count(self, block):
        """Block tables holding ``block`` (int); 0 for a free block."""
        return int(self._ref_counts[self._check_block_id(block)])

    def free_blocks(self):
        """The free blocks, the next one taken first (tuple of ints)."""
        return tuple(self._free)

    def is_cached(self, block):
        """Whether ``block`` is cached under a hash (bool)."""
        return block in self._hash_of_block

    def lookup(self, block_hash):
        """The first block cached under ``block_hash``, or None (V1's ``get_cached_block``)."""
        return next(iter(self._blocks_of_hash.get(block_hash, ())), None)

    def allocate(self, n):
        """Take ``n`` blocks off the head of the free queue, each with refcount 1: a list, in the order taken."""
        n = as_size("n", n)
        if n > self.num_free_blocks:
            raise OutOfBlocksError(f"out of blocks: {n} needed, {self.num_free_blocks} of {self.num_blocks} free")
        blocks = self._free.popleft_n(n)
        assert not self._ref_counts[blocks].any(), f"a block taken from the free list is held: {blocks}"
        for block in blocks:
            if self.on_take is not None and self.journal.recording:
                self.on_take(block)
            self._evict(block)
        self._set_ref_counts(blocks, 1)
        return blocks

    def share(self, blocks):
        """Add one holder to each of ``blocks`` (distinct, each held; or free and cached: a hit, V1's ``touch``)."""
        blocks = self._check_held(blocks, "share")
        for block in blocks:
            if self._ref_counts[block] == 0:  # a free cached block: a hit takes it out of the queue
                self._free.remove(block)
        self._set_ref_counts(blocks, self._ref_counts[blocks] + 1)

    def free(self, blocks):
        """Remove one holder from each of ``blocks``, given in eviction order (the first evicted first); return
        those left with none: the uncached ones go to the head of the free queue, the cached ones to its tail."""
        blocks = self._check_held(blocks, "free")
        self._set_ref_counts(blocks, self._ref_counts[blocks] - 1)
        assert (self._ref_counts[blocks] >= 0).all(), f"a refcount went below 0: {blocks}"
        released = [b for b in blocks if self._ref_counts[b] == 0]
        self._release(released)
        return released

    def cache(self, block, block_hash):
        """Cache held, full, uncached ``block`` under ``block_hash``, beside any block cached under it already."""
        (block,) = self._check_held([block], "cache")
        if not self.enable_caching or block in self._hash_of_block:
            raise ValueError(f"cannot cache block {block}: {'it is cached already' if self.enable_caching else 'no caching'}")
        self.journal.record(self._uncache, block)
        self._blocks_of_hash.setdefault(block_hash, {})[block] = None
        self._hash_of_block[block] = block_hash

    def _set_ref_counts(self, blocks, counts):
        if self.journal.recording:
            self.journal.record(self._ref_counts.__setitem__, blocks, self._ref_counts[blocks])
        self._ref_counts[blocks] = counts

    def _release(self, blocks):
        assert not self._ref_counts[blocks].any(), f"a block put back on the free list is held: {blocks}"
        assert self.num_free_blocks + len(blocks) <= self.num_blocks, "the free list would hold a block twice"
        self._free.prepend_n([b for b in blocks if not self.is_cached(b)])
        self._free.append_n([b for b in blocks if self.is_cached(b)])

    def _evict(self, block):
        """Drop the hash of ``block``, just taken off the queue (V1's ``_maybe_evict_cached_block``)."""
        block_hash = self._hash_of_block.get(block)
        if block_hash is None:
            return
        cached = self._blocks_of_hash[block_hash]
        self.journal.record(self._recache, block_hash, list(cached))
        self._uncache(block)

    def _uncache(self, block):
        block_hash = self._hash_of_block.pop(block)
        del self._blocks_of_hash[block_hash][block]
        if not self._blocks_of_hash[block_hash]:
            del self._blocks_of_hash[block_hash]

    def _recache(self, block_hash, blocks):
        self._blocks_of_hash[block_hash] = dict.fromkeys(blocks)  # in their order: a lookup gives the same first
        self._hash_of_block.update(dict.fromkeys(blocks, block_hash))

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
