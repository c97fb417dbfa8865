"""kv_attention: exact NumPy reference implementations of causal-attention decode.

Single head, softmax(q kᵀ / sqrt(D_k) + causal mask) v. Every strategy equals
:func:`causal_attention` position by position.
"""

from .attention import causal_attention
from .cache import DynamicCache, StaticCache
from .decode import (
    batched_cached_attention,
    cached_attention,
    cached_attention_preallocated,
    decode_without_cache,
    sequential_cached_attention,
)
from .problem import Problem, make_problem
from .strategies import EXPERIMENTS, STRATEGIES, get_strategy

__version__ = "0.1.0"

__all__ = [
    "causal_attention",
    "decode_without_cache",
    "cached_attention",
    "cached_attention_preallocated",
    "sequential_cached_attention",
    "batched_cached_attention",
    "DynamicCache",
    "StaticCache",
    "Problem",
    "make_problem",
    "STRATEGIES",
    "EXPERIMENTS",
    "get_strategy",
]

# Ragged batches and the paged KV cache.
from .paged import OutOfBlocksError, PagedKVCache  # noqa: E402
from .ragged import RAGGED_STRATEGIES, RaggedDecodeStats, ragged_decode, ragged_decode_steps  # noqa: E402

__all__ += [
    "PagedKVCache",
    "OutOfBlocksError",
    "ragged_decode",
    "ragged_decode_steps",
    "RaggedDecodeStats",
    "RAGGED_STRATEGIES",
]
