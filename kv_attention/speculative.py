"""Prompt-lookup speculative decoding: drafts copied from the context, verified in one forward, the cache cropped back.

A draft is the up to ``prompt_lookup_num_tokens`` tokens after the first earlier occurrence of the context's last
n-gram (n from ``max_matching_ngram_size`` down to 1): HF's ``PromptLookupCandidateGenerator``
(``generation/candidate_generator.py``), its names and defaults; vLLM's n-gram proposer likewise. One forward of
the last token and the draft gives the greedy token after each prefix; the draft's longest prefix equal to them is
kept, then the model's next token, and the cache cropped back (the loop: model.py). The output is greedy's, up to
the rounding of a forward of several tokens (a near tie may break the other way); sampled, each position is drawn
and the draft kept while equal (HF's rule, exact in distribution). What differs from HF: an end token inside a kept
draft ends the reply (HF checks the last token only); one sequence only.
"""

import dataclasses

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


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
