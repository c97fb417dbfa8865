"""The registry: each strategy name maps to its public function, grouped by experiment."""

import pytest

import kv_attention as kv

from ..references import BATCHED, SINGLE


def test_registry_names_map_to_the_public_functions():
    assert kv.STRATEGIES == {
        "no_cache": kv.decode_without_cache,
        "concat": kv.cached_attention,
        "preallocated": kv.cached_attention_preallocated,
        "sequential": kv.sequential_cached_attention,
        "batched": kv.batched_cached_attention,
    }
    assert kv.EXPERIMENTS == {"cache": SINGLE, "batch": BATCHED}
    assert kv.get_strategy("batched") is kv.batched_cached_attention
    with pytest.raises(ValueError, match="unknown strategy 'paged'.*no_cache"):
        kv.get_strategy("paged")
