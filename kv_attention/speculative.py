"""Prompt-lookup speculative decoding: drafts copied from the context, verified in one forward, the cache cropped back.

A draft is the up to ``prompt_lookup_num_tokens`` tokens that followed the first earlier occurrence of the
context's (``input_ids`` and the tokens generated) last n-gram (n from ``max_matching_ngram_size`` down to 1):
Hugging Face's ``PromptLookupCandidateGenerator`` (``generation/candidate_generator.py``), the names and
defaults of ``generate(prompt_lookup_num_tokens=k)``; vLLM's n-gram proposer does the same with
``prompt_lookup_min/max``. One forward of the last token and the draft gives the greedy token after
each prefix; the longest prefix of the draft equal to them is accepted, with the model's own next
token after it, and every layer's cache is cropped back to the tokens accepted. The output is the
greedy one: each token is the argmax of the logits after its prefix, up to the rounding of a forward
of several tokens against one (a near tie may break the other way). What differs from Hugging Face:
no stop token, and batches of one sequence only (as its assisted decoding); ``serve`` does not speculate.
"""

import dataclasses

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ._validation import as_size
from .cache import DynamicCache, StaticCache
from .model import check_cache, check_input_ids, check_weights, forward
from .paged import PagedCacheView


@dataclasses.dataclass
class SpecDecodingStats:
    """Counts of one :func:`prompt_lookup_generate` call, by vLLM's names (``v1/spec_decode/metrics.py``)."""

    num_forwards: int = 0  # the prefill and every verifying forward
    num_drafts: int = 0  # forwards that verified a non-empty draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


def prompt_lookup_candidates(tokens, num_output_tokens, max_matching_ngram_size):
    """The draft after ``tokens [T]``: the tokens after the first match of the last n-gram (int64 ``[<= k]``)."""
    tokens = np.asarray(tokens)
    for n in range(min(max_matching_ngram_size, len(tokens) - 1), 0, -1):
        matches = np.flatnonzero((sliding_window_view(tokens, n) == tokens[-n:]).all(axis=1))
        for start in matches + n:
            if start < len(tokens):  # the last n-gram matching itself has nothing after it
                return tokens[start : start + num_output_tokens]
    return tokens[:0]


def _crop(cache, length):
    """Every layer's cache cut back to ``length`` positions (a paged view: its blocks past them freed)."""
    if isinstance(cache, PagedCacheView):
        cache.crop([length])
    else:
        for c in cache:
            c.crop(length)


def prompt_lookup_generate(config, weights, input_ids, max_new_tokens, *, cache, prompt_lookup_num_tokens=10,
                           max_matching_ngram_size=None, convert_once=True):
    """Greedy ``input_ids [1, T]`` and ``max_new_tokens`` tokens (int64 ``[1, T + N]``), and the call's
    :class:`SpecDecodingStats`. ``cache``: one DynamicCache or StaticCache per layer, or one PagedCacheView for
    every layer, which can be cropped back exactly; ValueError or TypeError naming the argument otherwise (a window
    cache that wrapped or a quantized cache cannot take a draft back)."""
    k = as_size("prompt_lookup_num_tokens", prompt_lookup_num_tokens, minimum=1)
    n = 2 if max_matching_ngram_size is None else as_size("max_matching_ngram_size", max_matching_ngram_size, minimum=1)
    ids = check_input_ids(config, input_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"prompt lookup decodes one sequence: input_ids must be [1, T], got shape {ids.shape}")
    if cache is None:
        raise ValueError("prompt lookup needs a cache to crop a rejected draft back from: give cache=[...] per layer")
    for i, c in enumerate([] if isinstance(cache, PagedCacheView) else cache):
        if not isinstance(c, (DynamicCache, StaticCache)):
            raise TypeError(f"cache[{i}] is a {type(c).__name__}, which cannot crop a rejected draft back exactly; "
                            f"prompt lookup needs a DynamicCache or StaticCache per layer, or a PagedCacheView")
    max_new_tokens = as_size("max_new_tokens", max_new_tokens)
    if max_new_tokens:  # generate's checks: every step's room, before the first write
        check_cache(config, cache, ids, check_weights(config, weights), max_new_tokens)
    stats = SpecDecodingStats()
    if not max_new_tokens:
        return ids, stats
    held = int(np.max((cache if isinstance(cache, PagedCacheView) else cache[0]).get_seq_length()))  # before the call
    logits = forward(config, weights, ids, cache=cache, convert_once=convert_once)  # [1, T, vocab]: the prefill
    stats.num_forwards += 1
    tokens = np.concatenate([ids, logits[:, -1:].argmax(axis=-1)], axis=1)  # [1, T + 1]: cached all but the last
    end = ids.shape[1] + max_new_tokens
    while tokens.shape[1] < end:
        room = end - tokens.shape[1] - 1  # a verifying forward yields one token beyond its draft
        draft = prompt_lookup_candidates(tokens[0], min(k, room), n)
        logits = forward(config, weights, np.concatenate([tokens[0, -1:], draft])[None], cache=cache,
                         convert_once=convert_once)  # [1, 1 + d, vocab]
        greedy = logits[0].argmax(axis=-1)  # [1 + d]: the greedy token after each prefix of the last token and draft
        accepted = 0
        while accepted < len(draft) and draft[accepted] == greedy[accepted]:
            accepted += 1
        stats.num_forwards += 1
        stats.num_drafts += len(draft) > 0
        stats.num_draft_tokens += len(draft)
        stats.num_accepted_tokens += accepted
        tokens = np.concatenate([tokens, np.append(draft[:accepted], greedy[accepted])[None]], axis=1)
        if accepted < len(draft):  # the rejected draft tokens leave every layer's cache
            _crop(cache, held + tokens.shape[1] - 1)
    return tokens, stats
