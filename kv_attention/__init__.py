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

# Multi-head, grouped-query and multi-query attention; KV cache capacity.
from .capacity import MODEL_SHAPES, ModelShape, kv_cache_bytes  # noqa: E402
from .heads import multi_head_attention, multi_head_decode  # noqa: E402

__all__ += [
    "multi_head_attention",
    "multi_head_decode",
    "kv_cache_bytes",
    "ModelShape",
    "MODEL_SHAPES",
]
