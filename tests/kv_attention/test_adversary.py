"""Issue 47's promises tried adversarially, through the public API: every call atomic wherever it fails, a rejected
draft costing what it drops, and random sequences of calls against an independent reference.

Float64 weights, so that no near tie turns a token; logits compared within 1e-9 (absolute, logits of order one),
the K/V and pool state of a restored cache bit for bit (a restore puts back what was there).
"""

import numpy as np
import pytest

import kv_attention as kv

from ..references import naive_llama_forward
from .test_model import CONFIG, IDS, TOL, W64
from .test_scheduler import pool_state


def llama_pool(num_blocks=24, block_size=4, **options):
    return kv.PagedKVCache(num_blocks, block_size, CONFIG.head_dim, CONFIG.head_dim, num_kv_heads=2,
                           num_layers=CONFIG.num_hidden_layers, **options)


def test_a_commit_interrupted_half_way_is_undone_too(monkeypatch):
    # The call's 8 tokens fill two blocks, cached at its commit; Ctrl-C arrives as the second is cached.
    pool = llama_pool(enable_prefix_caching=True)
    pool.add_sequence(0)
    ids, before, real, cached = IDS[:1, :8], pool_state(pool), kv.block_allocator.BlockPool.cache, []

    def cache(self, block, block_hash):
        cached.append(block)
        if len(cached) == 2:
            raise KeyboardInterrupt
        return real(self, block, block_hash)

    monkeypatch.setattr(kv.block_allocator.BlockPool, "cache", cache)
    with pytest.raises(KeyboardInterrupt) as raised:
        kv.forward(CONFIG, W64, ids, cache=kv.PagedCacheView(pool, [0], token_ids=ids))
    assert raised.value.__context__ is None and len(cached) == 2
    assert pool_state(pool) == before  # main: 8 tokens kept and one block cached, though the call raised
    monkeypatch.undo()
    logits = kv.forward(CONFIG, W64, ids, cache=kv.PagedCacheView(pool, [0], token_ids=ids))
    np.testing.assert_allclose(logits, naive_llama_forward(CONFIG, W64, ids), **TOL)
    assert len(pool.find_cached_blocks(ids[0])) == 2


def test_a_rejected_draft_through_a_paged_view_rewrites_no_kept_token(monkeypatch):
    # A random prompt of 91 tokens ending in a repeat: every draft is rejected. Main put the pool back as at the
    # call's start and wrote every token of the call again, at each rejection: 93 tokens a layer for 4 dropped.
    rng = np.random.default_rng(3)
    base = rng.integers(0, 61, 6)
    prompt = np.concatenate([rng.integers(0, 61, 80), base, rng.integers(0, 61, 3), base[:3]])[None]
    pool = llama_pool(num_blocks=64)
    pool.add_sequence(0)
    real_crop, real_write, crops, rewritten = kv.PagedCacheView.crop, kv.PagedKVCache.write_slots, [], []

    def crop(self, lengths):
        crops.append(self.get_seq_length() - lengths)
        rewritten.append(0)
        try:
            return real_crop(self, lengths)
        finally:
            crops.append(None)

    def write_slots(self, layer, slot_mapping, k, v):
        if crops and crops[-1] is not None:  # inside a crop
            rewritten[-1] += np.size(slot_mapping)
        return real_write(self, layer, slot_mapping, k, v)

    monkeypatch.setattr(kv.PagedCacheView, "crop", crop)
    monkeypatch.setattr(kv.PagedKVCache, "write_slots", write_slots)
    tokens, stats = kv.prompt_lookup_generate(CONFIG, W64, prompt, 12, cache=kv.PagedCacheView(pool, [0]),
                                              prompt_lookup_num_tokens=4)
    monkeypatch.undo()
    assert stats.num_draft_tokens > stats.num_accepted_tokens and len(rewritten) > 3  # drafts rejected, cropped
    assert rewritten == [0] * len(rewritten)
    np.testing.assert_array_equal(tokens, kv.generate(CONFIG, W64, prompt, 12))
    assert pool.get_seq_length(0) == prompt.shape[1] + 11 and pool.blocks_in_use == -(-(prompt.shape[1] + 11) // 4)
