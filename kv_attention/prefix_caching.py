"""Automatic prefix caching: full blocks named by a chained hash, kept after use until their block is taken.

A full block is named by :func:`hash_block_tokens` of its parent block's hash and its
own token ids, so two sequences share a cached block only when every token before it
is the same too. When the last holder of a cached block frees it, the block keeps
its contents and hash on the tail of the free queue; a later sequence whose prefix
hashes the same takes it back out (a hit). Blocks are taken from the queue's head,
and a cached block taken there loses its hash (evicted): the least recently freed
first, and of one sequence its last block first.

What matches vLLM V1 (``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens``,
``FreeKVCacheBlockQueue``; ``vllm/v1/core/block_pool.py``: ``cache_full_blocks``,
``get_cached_block``, ``touch``, ``free_blocks``, ``_maybe_evict_cached_block``):
the chained hash (sha256, vLLM's ``--prefix-caching-hash-algo sha256``), full blocks
only, one queue of free and cached blocks, and no de-duplication: a block whose hash
is cached already is cached as well, and a lookup gives the first cached under it
(``BlockHashToBlockMap``: "we want to make sure the allocated block IDs won't change
so that block tables are append-only"). What differs: no hash of extra keys (LoRA,
multimodal inputs, cache salt) and no KV cache groups.
"""

import hashlib

import numpy as np

from .block_allocator import BlockAllocator


def hash_block_tokens(parent_hash, block_token_ids):
    """The hash of a full block: sha256 of its parent's hash (None for the first block) and its token ids (bytes)."""
    tokens = np.ascontiguousarray(block_token_ids, dtype="<i8")
    return hashlib.sha256((parent_hash or b"") + tokens.tobytes()).digest()


class PrefixCachingAllocator(BlockAllocator):
    """A :class:`BlockAllocator` whose full blocks, once cached, stay cached on the free queue until taken."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self._blocks_of_hash = {}  # block hash -> {block: None}, the first cached first
        self._hash_of_block = {}  # cached block -> its hash

    @property
    def num_cached_blocks(self):
        """Blocks cached under a hash, held or free (int)."""
        return len(self._hash_of_block)

    def lookup(self, block_hash):
        """The first block cached under ``block_hash``, or None."""
        return next(iter(self._blocks_of_hash.get(block_hash, ())), None)

    def cache(self, block, block_hash):
        """Cache held, full, uncached ``block`` under ``block_hash``, beside any block cached under it already."""
        (block,) = self._check_held([block], "cache")
        if block in self._hash_of_block:
            raise ValueError(f"cannot cache block {block}: it is cached already")
        self._blocks_of_hash.setdefault(block_hash, {})[block] = None
        self._hash_of_block[block] = block_hash

    def checkpoint(self, n):
        """The next ``n`` blocks, and the hashes of those cached (allocating evicts them), for :meth:`restore`."""
        taken = super().checkpoint(n)
        hashes = {self._hash_of_block[b] for b in taken if b in self._hash_of_block}
        return taken, {h: dict(self._blocks_of_hash[h]) for h in hashes}

    def restore(self, state):
        """Give back the blocks of a :meth:`checkpoint`, those it evicted cached again, each in its place."""
        taken, cached = state
        assert not any(self._ref_counts[b] and b in self._hash_of_block for b in taken), f"cached since: {taken}"
        super().restore(taken)
        for block_hash, blocks in cached.items():
            self._blocks_of_hash[block_hash] = blocks
            self._hash_of_block.update(dict.fromkeys(blocks, block_hash))

    def is_cached(self, block):
        return block in self._hash_of_block

    def _evict(self, blocks):
        for block in blocks:
            block_hash = self._hash_of_block.pop(block, None)
            if block_hash is not None:
                cached = self._blocks_of_hash[block_hash]
                del cached[block]
                if not cached:
                    del self._blocks_of_hash[block_hash]
