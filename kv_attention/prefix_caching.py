"""Automatic prefix caching: full blocks named by a chained hash, kept after use until evicted, LRU first.

A full block is named by :func:`hash_block_tokens` of its parent block's hash and its
own token ids, so two sequences share a cached block only when every token before it
is the same too. When the last holder of a cached block frees it, the block keeps
its contents and hash, refcount 0, on an evictable list; a later sequence whose prefix
hashes the same takes it back. A new block comes from the plain free list first, then
by evicting the least recently freed cached block, its hash dropped with it.

What matches vLLM (``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens``;
``vllm/v1/core/block_pool.py``: ``cache_full_blocks``, ``touch``,
``_maybe_evict_cached_block``): the chained hash (sha256, vLLM's
``--prefix-caching-hash-algo sha256``), full blocks only, the tail of a freed sequence
evicted first. What differs: V1 keeps one
``FreeKVCacheBlockQueue`` of free and cached blocks and evicts a cached block as it
reaches it; here hashless free blocks are taken before any cached one, as V0's
``PrefixCachingBlockAllocator`` (``vllm/core/block/prefix_caching_block.py``) did.
"""

import hashlib
from collections import OrderedDict

import numpy as np

from .block_allocator import BlockAllocator


def hash_block_tokens(parent_hash, block_token_ids):
    """The hash of a full block: sha256 of its parent's hash (None for the first block) and its token ids (bytes)."""
    tokens = np.ascontiguousarray(block_token_ids, dtype="<i8")
    return hashlib.sha256((parent_hash or b"") + tokens.tobytes()).digest()


class PrefixCachingAllocator(BlockAllocator):
    """A :class:`BlockAllocator` whose full blocks, once cached, stay cached at refcount 0 until evicted."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self._block_of_hash = {}  # block hash -> cached block
        self._hash_of_block = {}  # cached block -> its hash
        self._evictable = OrderedDict()  # cached blocks of refcount 0, least recently freed first

    @property
    def num_free_blocks(self):
        """Blocks :meth:`allocate` can take: the free list's and the evictable cached ones (int)."""
        return self._num_free + len(self._evictable)

    @property
    def num_cached_blocks(self):
        """Blocks cached under a hash, held or evictable (int)."""
        return len(self._hash_of_block)

    def free_blocks(self):
        """The blocks of refcount 0 in the order :meth:`allocate` takes them: free list, then evictable (tuple)."""
        return super().free_blocks() + tuple(self._evictable)

    def lookup(self, block_hash):
        """The cached block of ``block_hash``, or None."""
        return self._block_of_hash.get(block_hash)

    def cache(self, block, block_hash):
        """Cache held, full ``block`` under ``block_hash``; False (nothing changed) if either is cached already.

        vLLM likewise keeps the first block cached under a hash and leaves a
        duplicate uncached, so that block tables stay append-only.
        """
        (block,) = self._check_held([block], "cache")
        if block_hash in self._block_of_hash or block in self._hash_of_block:
            return False
        self._block_of_hash[block_hash], self._hash_of_block[block] = block, block_hash
        return True

    def is_cached(self, block):
        return block in self._hash_of_block

    def _take(self, n):
        """The free list's blocks first, then the evictable ones, least recently freed first (their hashes dropped)."""
        blocks = super()._take(min(n, self._num_free))
        for _ in range(n - len(blocks)):
            block, _ = self._evictable.popitem(last=False)
            assert self._ref_counts[block] == 0, f"evictable block {block} is held"
            del self._block_of_hash[self._hash_of_block.pop(block)]
            blocks.append(block)
        return blocks

    def share(self, blocks):
        """Add one holder to each of ``blocks``: held ones (a fork) or cached ones of refcount 0 (a hit)."""
        blocks = self._check_held(blocks, "share", cached=self._evictable)
        for block in blocks:
            self._evictable.pop(block, None)
        self._ref_counts[blocks] += 1

    def _release(self, blocks):
        """Cached blocks go to the evictable list's most recent end; the others to the free list."""
        for block in blocks:
            if block in self._hash_of_block:
                assert block not in self._evictable, f"block {block} is on the evictable list twice"
                self._evictable[block] = None
        super()._release([b for b in blocks if b not in self._hash_of_block])
