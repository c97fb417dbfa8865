"""Prompt-lookup speculative decoding: Hugging Face's drafts, plain greedy's tokens, every cache cropped back exactly.

Random float64 weights, so that no near tie can turn a token: the tokens must equal plain greedy's
exactly, and the caches plain greedy leaves within 1e-12 (a forward of several tokens rounds
differently from one of one).
"""

import numpy as np
import pytest

import kv_attention as kv
from kv_attention import prompt_lookup_generate
from kv_attention.speculative import prompt_lookup_candidates

from .test_model import CONFIG, W64, caches, lengths, paged_views

PROMPT = np.tile(np.arange(1, 9), 3)[None, :-5]  # 1..8 twice, then 1..3: the bigram (2, 3) has come before


@pytest.mark.parametrize("tokens, k, n, draft", [
    ([1, 2, 3, 4, 1, 2], 3, 2, [3, 4, 1]),  # the first match of the last bigram, k tokens after it
    ([1, 2, 3, 4, 1, 2], 10, 2, [3, 4, 1, 2]),  # up to the end of the context
    ([5, 6, 7, 6], 3, 2, [7, 6]),  # no earlier bigram: the unigram 6, first seen at 1
    ([5, 6, 7, 6], 3, 1, [7, 6]),
    ([1, 2, 3], 3, 2, []),  # no match: no draft
    ([4, 4], 2, 3, [4]),  # n capped at T - 1
])
def test_the_draft_is_huggingfaces_prompt_lookup_candidate(tokens, k, n, draft):
    assert prompt_lookup_candidates(tokens, k, n).tolist() == draft


def spec_caches(kind, max_seq_len=64):
    return paged_views(batch=1) if kind == "paged" else caches(kind, batch=1, max_seq_len=max_seq_len)


@pytest.mark.parametrize("kind", ["dynamic", "static", "paged"])
@pytest.mark.parametrize("k, n", [(1, None), (3, 1), (10, 2), (10, 3)])
def test_prompt_lookup_gives_plain_greedys_tokens_and_caches(kind, k, n):
    plain_cache, spec_cache = spec_caches(kind), spec_caches(kind)
    expected = kv.generate(CONFIG, W64, PROMPT, 24, cache=plain_cache)
    tokens, stats = prompt_lookup_generate(CONFIG, W64, PROMPT, 24, cache=spec_cache, prompt_lookup_num_tokens=k,
                                           max_matching_ngram_size=n)
    np.testing.assert_array_equal(tokens, expected)
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0  # drafts were made, some taken, some not
    assert stats.num_accepted_tokens < stats.num_draft_tokens <= k * stats.num_drafts
    assert stats.num_forwards + stats.num_accepted_tokens == 24  # each forward yields one token beyond its accepted
    assert np.array_equal(kv.generate(CONFIG, W64, PROMPT, 24, cache=spec_caches(kind), prompt_lookup_num_tokens=k,
                                      max_matching_ngram_size=n), expected)
    if kind == "paged":  # one view, one block table for every layer
        pool, plain_pool = spec_cache.cache, plain_cache.cache
        np.testing.assert_array_equal(spec_cache.get_seq_length(), plain_cache.get_seq_length())
        assert pool.num_free_blocks == plain_pool.num_free_blocks  # a rejected draft's blocks are freed
        assert len(pool.block_table(0)) == len(plain_pool.block_table(0))
        for layer in range(CONFIG.num_hidden_layers):  # the tokens stored (past them, a last block's slots are stale)
            (k, v, (n,)), (plain_k, plain_v, _) = pool.gather([0], layer), plain_pool.gather([0], layer)
            np.testing.assert_allclose(k[:, :n], plain_k[:, :n], rtol=0, atol=1e-12)
            np.testing.assert_allclose(v[:, :n], plain_v[:, :n], rtol=0, atol=1e-12)
        return
    for plain, spec in zip(plain_cache.layers, spec_cache.layers):  # every rejected draft token left every layer
        assert spec.get_seq_length() == plain.get_seq_length()
        np.testing.assert_allclose(spec.k_cache, plain.k_cache, rtol=0, atol=1e-12)
        np.testing.assert_allclose(spec.v_cache, plain.v_cache, rtol=0, atol=1e-12)
        if kind == "static":  # past the length, exactly the zeros of a cache that never saw a draft
            assert not spec.k_cache[..., spec.get_seq_length():, :].any()
            assert not spec.v_cache[..., spec.get_seq_length():, :].any()


def test_no_prefix_cache_entry_holds_a_drafted_token():
    """The prompt's full blocks are cached (written with its token ids); the decode after it, drafts and all,
    caches none, as plain greedy's."""
    cached = []
    for k in (None, 10):
        view = paged_views(batch=1, enable_prefix_caching=True)
        first = kv.forward(CONFIG, W64, PROMPT, cache=kv.PagedCacheView(view.cache, [0], token_ids=PROMPT))
        out = kv.generate(CONFIG, W64, first[:, -1].argmax(-1)[:, None], 12, cache=view, prompt_lookup_num_tokens=k)
        cached.append((view.cache.block_pool.num_cached_blocks, out.tolist()))
    assert cached[0] == cached[1] and cached[0][0] == PROMPT.shape[1] // 4  # block_size 4


def test_max_new_tokens_is_exact_even_when_a_draft_could_run_past_it():
    for n_new in range(5):
        expected = kv.generate(CONFIG, W64, PROMPT, n_new, cache=spec_caches("static"))
        room = PROMPT.shape[1] + max(n_new - 1, 0)  # what plain greedy writes: a draft must not need more
        tokens, stats = prompt_lookup_generate(CONFIG, W64, PROMPT, n_new, cache=spec_caches("static", room),
                                               prompt_lookup_num_tokens=10)
        np.testing.assert_array_equal(tokens, expected)
        assert stats.num_forwards + stats.num_accepted_tokens == n_new


@pytest.mark.parametrize("make, kwargs, error, message", [
    (lambda: caches("dynamic", batch=2), {"input_ids": np.tile(PROMPT, (2, 1))}, ValueError, r"\[1, T\]"),
    (lambda: None, {"use_cache": False}, ValueError, "needs a cache"),
    (lambda: caches("quantized", batch=1), {}, TypeError, r"crops a rejected draft back exactly .* got QuantizedCache"),
    (lambda: caches("window", batch=1, window=8), {}, TypeError, r"exactly .* got SlidingWindowCache"),
    (lambda: caches("dynamic", batch=1), {"prompt_lookup_num_tokens": 0}, ValueError, "prompt_lookup_num_tokens"),
    (lambda: caches("dynamic", batch=1), {"max_matching_ngram_size": 0}, ValueError, "max_matching_ngram_size"),
])
def test_what_cannot_take_a_draft_back_is_refused_before_any_write(make, kwargs, error, message):
    cache = make()
    call = {"input_ids": PROMPT, "prompt_lookup_num_tokens": 3} | kwargs
    with pytest.raises(error, match=message):
        kv.generate(CONFIG, W64, max_new_tokens=4, cache=cache, **call)
    assert cache is None or lengths(cache) == ["0", "0"]


def test_prompt_lookup_generate_itself_checks_every_steps_room_before_the_first_write():
    cache = spec_caches("static", max_seq_len=PROMPT.shape[1] + 2)
    with pytest.raises(kv.StaticCacheFullError, match="writes"):
        prompt_lookup_generate(CONFIG, W64, PROMPT, 10, cache=cache)
    assert lengths(cache) == ["0", "0"]
    for bad, error in ((-1, ValueError), (2.5, TypeError)):
        with pytest.raises(error, match="max_new_tokens"):
            prompt_lookup_generate(CONFIG, W64, PROMPT, bad, cache=spec_caches("dynamic"))
