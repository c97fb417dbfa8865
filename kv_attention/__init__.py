"""kv_attention: exact NumPy reference implementations of causal-attention decode.

Five single-head decode strategies, each equal to :func:`causal_attention` position by position; multi-head, GQA
and MQA (``heads``); ragged batches over a paged cache (``ragged``, ``paged``); chunked prefill, sliding windows and
sinks (``chunked``, ``window``); serving with prefix caching and preemption (``scheduler``); split-KV and cascade
attention merged by log-sum-exp (``split``); and a Llama model over one cache object (``model``, ``gguf``,
``tokenizer``: SmolLM2-135M-Instruct, ``python -m kv_attention``). Inputs are float32 or float64; bad input raises
TypeError or ValueError naming the argument before anything is written; a full cache raises CacheFullError.
"""

from .attention import attend, causal_attention, masked_attend
from .cache import Cache, CacheFullError, DynamicCache, StaticCache, StaticCacheFullError
from .capacity import MODEL_SHAPES, NAMED_ITEMSIZES, ModelShape, kv_cache_bytes
from .chunked import chunked_attention
from .decode import (batched_cached_attention, cached_attention, cached_attention_preallocated, decode_without_cache,
                     sequential_cached_attention)
from .gguf import load_gguf, smollm2_path
from .heads import multi_head_attention, multi_head_decode
from .model import ModelConfig, forward, generate, init_weights, load_weights, prompt_lookup_generate
from .paged import OutOfBlocksError, PagedCacheView, PagedKVCache, paged_attention
from .problem import Problem, make_problem
from .quantized import QuantizedCache, attend_quantized
from .ragged import RAGGED_STRATEGIES, RaggedDecodeStats, ragged_decode, ragged_decode_steps
from .scheduler import Request, ServeResult, ServeStats, serve
from .speculative import SpecDecodingStats
from .split import attention_state, cascade_attention, merge_attention_states, split_kv_attention
from .tokenizer import Tokenizer
from .strategies import EXPERIMENTS, STRATEGIES, get_strategy
from .window import SlidingWindowCache

__version__ = "0.1.0"

__all__ = [
    # one head: the reference, one step, the five decode strategies and their caches
    "causal_attention", "attend", "masked_attend", "decode_without_cache", "cached_attention",
    "cached_attention_preallocated", "sequential_cached_attention", "batched_cached_attention",
    "Cache", "DynamicCache", "StaticCache", "CacheFullError", "StaticCacheFullError",
    "Problem", "make_problem", "STRATEGIES", "EXPERIMENTS", "get_strategy",
    # multi-head, GQA and MQA; KV cache capacity
    "multi_head_attention", "multi_head_decode", "kv_cache_bytes", "ModelShape", "MODEL_SHAPES", "NAMED_ITEMSIZES",
    # ragged batches, the paged KV cache and paged attention
    "PagedKVCache", "OutOfBlocksError", "paged_attention", "ragged_decode", "ragged_decode_steps",
    "RaggedDecodeStats", "RAGGED_STRATEGIES",
    # attention states merged by log-sum-exp: split-KV (flash-decoding) and cascade attention
    "attention_state", "merge_attention_states", "split_kv_attention", "cascade_attention",
    # chunked prefill, sliding windows and attention sinks; a quantized KV cache
    "chunked_attention", "SlidingWindowCache", "QuantizedCache", "attend_quantized",
    # serving: continuous batching, preemption and prefix caching over the paged cache
    "Request", "serve", "ServeResult", "ServeStats",
    # a Llama-architecture model decoding through a cache per layer
    "ModelConfig", "init_weights", "load_weights", "forward", "generate", "PagedCacheView",
    # a real model: a Llama GGUF file's config, float32 weights and tokenizer (the gguf extra)
    "load_gguf", "smollm2_path", "Tokenizer",
    # speculative decoding: prompt-lookup drafts verified in one forward, the caches cropped back
    "prompt_lookup_generate", "SpecDecodingStats",
]
