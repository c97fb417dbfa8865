"""The registry: each strategy name (an asv parameter value) mapped to its function.

Experiments group the names as the lab does: the cache experiment decodes one
sequence ``x: [T, D_model]``; the batch experiment decodes ``x: [B, T, D_model]``.
"""

from ._validation import check_choice
from .decode import (batched_cached_attention, cached_attention, cached_attention_preallocated, decode_without_cache,
                     sequential_cached_attention)

STRATEGIES = {
    "no_cache": decode_without_cache,
    "concat": cached_attention,
    "preallocated": cached_attention_preallocated,
    "sequential": sequential_cached_attention,
    "batched": batched_cached_attention,
}

EXPERIMENTS = {
    "cache": ("no_cache", "concat", "preallocated"),
    "batch": ("sequential", "batched"),
}


def get_strategy(name):
    """Return the decode function registered as ``name``; ValueError (listing the names) for another."""
    check_choice("strategy", name, STRATEGIES)
    return STRATEGIES[name]
