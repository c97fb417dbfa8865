"""A Llama-architecture decoder whose attention runs through the library's caches, one cache per layer.

Shapes (axis letters as in ``heads``): ``input_ids [B, T]`` integers in [0, vocab_size);
logits ``[B, T, vocab_size]``; per layer q ``[B, H_q, T, D_head]``, k and v ``[B, H_kv, T, D_head]``.
``weights`` is a dict keyed by Hugging Face's Llama state-dict names in its
``[out_features, in_features]`` layout, so ``load_weights`` of a checkpoint's
``model.safetensors`` runs as it is. The computation is float64 for float64
weights and float32 for any other float weights (float32, bfloat16, float16).

``cache``: None (the whole sequence at once), a list of one cache per layer, each
of ``batch_shape (B, H_kv)``: a DynamicCache, StaticCache, QuantizedCache or
SlidingWindowCache (k/v ``[B, H_kv, T, D_head]``), or one :class:`~kv_attention.paged.PagedCacheView`
for every layer (a paged cache of ``num_layers`` layers and ``num_kv_heads`` bound to B sequence
ids: one block table per sequence serves every layer, as vLLM V1's KV cache manager). With a cache,
``input_ids`` are the new tokens and their positions continue from
``cache[0].get_seq_length()`` (a window cache counts every position it has seen; a
paged view gives one length per sequence); prefill and decode are one call.

The layer is Hugging Face's ``modeling_llama.py`` (``LlamaDecoderLayer``):
``x += o_proj(attn(RoPE(q_proj(rms(x))), RoPE(k_proj(rms(x))), v_proj(rms(x))))``, then
``x += down_proj(silu(gate_proj(rms(x))) * up_proj(rms(x)))``; a final RMSNorm and ``lm_head``
(the embedding when ``tie_word_embeddings``). What matches: RMSNorm ``w · x / sqrt(mean(x²) + eps)``
in at least float32 (``LlamaRMSNorm``); RoPE in ``rotate_half`` form, ``inv_freq = theta^(-2i/D)``,
cos/sin of ``cat(freqs, freqs)``, applied to q and k before k is cached; query head h reads
K/V head ``h // G`` (``repeat_kv``); scale ``1/sqrt(D_head)``. What differs: a float64 model
computes in float64 throughout, where transformers rounds its RoPE tables and each RMSNorm's
normalised x through float32 (and its eager attention's softmax), so float64 logits agree
with ``LlamaForCausalLM`` to about 1e-6, and to 1e-15 with those roundings copied
(``tests/kv_attention/test_model.py``); no ``rope_scaling``, attention or MLP bias, dropout
or padding mask (``from_json`` refuses a config that has them). gpt-fast's ``model.py`` is
the same layer in the same few hundred lines, with two differences: its RoPE pairs adjacent
channels (Meta's layout; its ``convert_hf_checkpoint.py`` permutes HF's q/k weights), where
``rotate_half`` pairs channel i with i + D/2, so HF's weights load unchanged; and its
``KVCache`` returns the whole ``[B, H, max_seq_len, D]`` buffer under a causal mask, where
here each cache returns the keys to attend to and a band mask covers only what a chunk may
not see. nanoGPT's is GPT-2 (LayerNorm, learned positions, GELU, no KV cache): the anchor for
the file's shape, a config dataclass and one function per concept.

Window caches: exact against the full forward while the sequence fits the window. Beyond
it a SlidingWindowCache of window W behaves as Hugging Face's ``DynamicSlidingWindowLayer``
(``cache_utils.py``) with ``sliding_window=W``: keys rotated at their absolute positions, and a
query at position t attends to keys t - W < s <= t (``masking_utils.sliding_window_overlay``;
HF keeps W - 1 past keys and this ring W, the oldest of which no query attends to).
A QuantizedCache is attended over its own dequantized K̂/V̂.

Errors, raised before any cache is written, every layer's checked first: ValueError naming the
argument for token ids outside the vocabulary, no token where the cache holds none, a cache list
of the wrong length, one cache for several layers, a paged cache of another number of layers,
layers of different lengths,
a cache of the wrong batch shape or k/v width, a paged view whose ``token_ids`` are not
``input_ids``, or weights missing, unexpected or of the wrong shape; TypeError for token ids
that are not integers, a cache that is not one, or one whose dtype cannot hold the model's;
StaticCacheFullError (a ValueError) for a StaticCache too short, OutOfBlocksError for a
paged pool too small. An error inside the layers (a NaN or inf, or a value a storage dtype
cannot hold, refused by a later layer's cache) crops every layer written back to its length
before the call, then propagates, so that each cache holds what it held: a dynamic, static,
paged or window cache its keys and values as they were; a quantized cache keeps quantized
what the write quantized (its ``crop``); a window cache that a chunk of several tokens wrapped
cannot be cropped back (its ValueError). A paged cache is one state for every layer: back at its
lengths, no block the call filled cached, a shared last block it copied kept as the copy.
"""

import dataclasses
import json
import os

import numpy as np

from ._validation import as_flag, as_integer_array, as_size, compute_dtype
from .attention import attention_forward
from .cache import Cache, StaticCacheFullError
from .chunked import chunk_mask
from .paged import PagedCacheView, PagedKVCache, PagedLayer
from .quantized import QuantizedCache


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hugging Face ``LlamaConfig``'s fields that the forward uses; ``head_dim`` None is hidden_size // heads."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False

    def __post_init__(self):
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads"):
            as_size(field, getattr(self, field), minimum=1)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        as_size("head_dim", self.head_dim, minimum=1)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        for field, least, rule in (("rope_theta", np.nextafter(0, 1), "> 0"), ("rms_norm_eps", 0, ">= 0")):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"{field} must be a number, got {value!r}")
            if not least <= value < np.inf:  # NaN fails too
                raise ValueError(f"{field} must be finite and {rule}, got {value!r}")
        as_flag("tie_word_embeddings", self.tie_word_embeddings)

    @classmethod
    def from_json(cls, path):
        """The config of a Hugging Face ``config.json``; ValueError unless it is a plain Llama architecture."""
        if not isinstance(path, (str, bytes, os.PathLike)):  # an int would be opened as a file descriptor
            raise TypeError(f"path must be a path to a config.json, got {path!r}")
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a config.json holds a JSON object, got {type(raw).__name__}")
        if raw.get("model_type") != "llama" or raw.get("architectures", ["LlamaForCausalLM"]) != ["LlamaForCausalLM"]:
            raise ValueError(f"{path}: not a Llama model (model_type={raw.get('model_type')!r}, "
                             f"architectures={raw.get('architectures')!r}); only LlamaForCausalLM is supported")
        rope = raw.pop("rope_parameters", None) or {}  # transformers 5 writes rope_theta in here
        if not isinstance(rope, dict):
            raise ValueError(f"{path}: rope_parameters must be a JSON object, got {rope!r}")
        raw.setdefault("num_key_value_heads", raw.get("num_attention_heads"))  # LlamaConfig's default: MHA
        raw.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"{path}: rope_parameters={rope!r} is not supported (only rope_type 'default')")
        unsupported = {"rope_scaling": None, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}
        for key, plain in unsupported.items():
            if raw.get(key, plain) != plain:
                raise ValueError(f"{path}: {key}={raw[key]!r} is not supported (only {key}={plain!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


# Weights: Hugging Face's state-dict names and [out_features, in_features] shapes

LAYER_WEIGHTS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def weight_shapes(config):
    """``{name: shape}`` of every weight the model reads."""
    c, d = config, config.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size), "model.norm.weight": (c.hidden_size,)}
    for i in range(c.num_hidden_layers):
        q, kv = (c.num_attention_heads * d, c.hidden_size), (c.num_key_value_heads * d, c.hidden_size)
        layer = ((c.hidden_size,), q, kv, kv, q[::-1], (c.hidden_size,), (c.intermediate_size, c.hidden_size),
                 (c.intermediate_size, c.hidden_size), (c.hidden_size, c.intermediate_size))
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in zip(LAYER_WEIGHTS, layer)})
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def init_weights(config, *, seed=0, dtype=np.float32):
    """Random weights, in the order of :func:`weight_shapes`: every matrix N(0, 1/columns) (the embedding's
    columns are hidden_size), every norm 1, so that projections and logits, tied or not, are of order one."""
    rng = np.random.default_rng(seed)
    return {name: (np.ones(shape) if len(shape) == 1 else rng.standard_normal(shape) / np.sqrt(shape[1])).astype(dtype)
            for name, shape in weight_shapes(config).items()}


def load_weights(path):
    """The tensors of a ``.safetensors`` file as NumPy arrays (``safetensors.numpy.load_file``)."""
    from safetensors.numpy import load_file

    return load_file(path)


def check_weights(config, weights):
    """The computation dtype (float64 for float64 weights, else float32); ValueError naming a bad weight."""
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict of Hugging Face state-dict names, got {type(weights).__name__}")
    shapes = weight_shapes(config)
    missing, extra = sorted(shapes.keys() - weights.keys()), sorted(weights.keys() - shapes.keys())
    if missing or extra:
        raise ValueError(f"weights do not fit the config: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}")
    for name, shape in shapes.items():
        w = weights[name]
        if (not isinstance(w, np.ndarray) or isinstance(w, np.ma.MaskedArray) or w.shape != shape
                or not (w.dtype.kind == "f" or w.dtype.name == "bfloat16")):
            raise ValueError(f"weights[{name!r}] must be a float array of shape {shape}, "
                             f"got {getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    dtypes = {weights[name].dtype for name in shapes}
    return np.dtype(np.float64) if dtypes == {np.dtype(np.float64)} else np.dtype(np.float32)


# The layer


def linear(x, w):
    """``x @ w.T`` of ``x [..., in]`` and ``w [out, in]``: ``[..., out]``, as one 2-D matmul, so that every row
    of a batch shares one pass over w (numpy's stacked matmul runs one product per leading index: 1.3x
    slower for ``x [8, 1, 576]`` against SmolLM's ``[1536, 576]``, one BLAS thread)."""
    return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(x.shape[:-1] + w.shape[:1])


def rms_norm(x, weight, eps):
    """``weight · x / sqrt(mean(x²) + eps)`` over the last axis (LlamaRMSNorm)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_tables(positions, head_dim, theta, dtype):
    """``(cos, sin)`` ``[..., T, D_head]`` of ``positions [..., T]``: cat(freqs, freqs), freqs = p · theta^(-2i/D)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)  # [D_head / 2]
    freqs = np.asarray(positions, np.float64)[..., None] * inv_freq  # [..., T, D_head / 2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [..., T, D_head]
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def apply_rope(x, cos, sin):
    """``x · cos + rotate_half(x) · sin`` of ``x [B, H, T, D_head]``, rotate_half(x) = cat(-x2, x1)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # [B, H, T, D_head]
    return x * cos + rotated * sin


def attention(config, w, x, cos, sin, start, layer_cache, dtype):
    """Grouped-query self-attention of ``x [B, T, D_model]`` through ``layer_cache``: ``[B, T, D_model]``."""
    B, T, _ = x.shape
    H, H_kv, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = linear(x, w["self_attn.q_proj.weight"]).reshape(B, T, H, D).transpose(0, 2, 1, 3)  # [B, H, T, D]
    k = linear(x, w["self_attn.k_proj.weight"]).reshape(B, T, H_kv, D).transpose(0, 2, 1, 3)  # [B, H_kv, T, D]
    v = linear(x, w["self_attn.v_proj.weight"]).reshape(B, T, H_kv, D).transpose(0, 2, 1, 3)  # [B, H_kv, T, D]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if isinstance(layer_cache, PagedLayer):
        layer_cache.update(k, v)
        out = layer_cache.attend(q)  # [B, H, T, D]
    else:
        window, n_sink = None, 0
        if layer_cache is None:
            key_positions = np.arange(T)
        else:
            key_positions, window, n_sink = layer_cache.key_positions(T), layer_cache.window, layer_cache.n_sink
            k, v = layer_cache.update(k, v)  # [B, H_kv, S, D]: the keys this chunk may attend to
        mask = chunk_mask(start, start + T, key_positions, window, n_sink)  # [T, S] or None
        group = H // H_kv  # head h reads K/V head h // G; a group's G·T query rows are one matmul with its K/V head
        mask = None if mask is None else np.tile(mask, (group, 1))  # [G·T, S]
        out = attention_forward(q.reshape(B, H_kv, group * T, D), k.astype(dtype, copy=False),
                                v.astype(dtype, copy=False), mask)  # [B, H_kv, G·T, D]
    out = out.astype(dtype, copy=False).reshape(B, H, T, D).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    return linear(out, w["self_attn.o_proj.weight"])  # [B, T, D_model]


def mlp(w, x):
    """SwiGLU: ``down(silu(gate(x)) · up(x))``, ``[B, T, D_model]``."""
    gate = linear(x, w["mlp.gate_proj.weight"])  # [B, T, D_ff]
    with np.errstate(over="ignore"):  # exp(-gate) = inf for a very negative gate: silu is then -0, as it should be
        silu = gate / (1.0 + np.exp(-gate))
    return linear(silu * linear(x, w["mlp.up_proj.weight"]), w["mlp.down_proj.weight"])


# Checks of the tokens and the caches, before anything is written


def check_input_ids(config, input_ids):
    """``input_ids`` as int64 ``[B, T]``; ValueError for another shape or an id outside [0, vocab_size)."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    ids = as_integer_array("input_ids", input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {ids.shape}")
    if ids.size and ids.max() >= config.vocab_size:
        raise ValueError(f"input_ids holds {ids.max()}, outside the vocabulary [0, vocab_size={config.vocab_size})")
    return ids


def check_cache(config, cache, ids, dtype):
    """Raise unless ``cache`` is None, one paged view for every layer, or one cache of its own per layer that takes this call's k/v ``[B, H_kv, T, D]``
    of ``dtype``: batch shape ``(B, H_kv)``, k and v widths ``head_dim``, a dtype that holds ``dtype``, room for T.
    Every layer is checked here, so that no layer is written before a later one is refused."""
    if cache is None:
        return
    if isinstance(cache, PagedCacheView):
        if cache.cache.num_layers != config.num_hidden_layers:
            raise ValueError(f"cache is a paged cache of num_layers={cache.cache.num_layers}, the model has "
                             f"num_hidden_layers={config.num_hidden_layers}")
        caches = [cache]  # one block table per sequence: every layer's
    elif not isinstance(cache, (list, tuple)) or len(cache) != config.num_hidden_layers:
        raise ValueError(f"cache must be a list of num_hidden_layers={config.num_hidden_layers} caches, "
                         f"got {type(cache).__name__} of length {len(cache) if hasattr(cache, '__len__') else '?'}")
    else:
        caches = cache
    for i, c in enumerate(caches if caches is cache else ()):
        if isinstance(c, (PagedKVCache, PagedCacheView)):
            raise TypeError(f"cache[{i}] is paged: pass one PagedCacheView(pool, seq_ids) as cache, its pool of "
                            f"num_layers={config.num_hidden_layers} serving every layer")
        if not isinstance(c, Cache):
            raise TypeError(f"cache[{i}] must be a kv_attention.Cache, got {c!r:.100}")
    if len({id(c) for c in caches}) < len(caches):
        raise ValueError("cache holds one cache for several layers: each layer needs its own")
    (batch, t_new), d = ids.shape, config.head_dim
    expected = ((batch, config.num_key_value_heads), d, d)
    for i, c in enumerate(caches):
        *layout, stored = _layout(c)
        if layout[0] is not None and tuple(layout) != expected:
            raise ValueError(f"cache[{i}] holds batch shape {layout[0]}, k width {layout[1]} and v width {layout[2]}, "
                             f"but the call needs (B, num_key_value_heads) = {expected[0]} and head_dim {d} for both")
        if stored is not None and not np.can_cast(dtype, compute_dtype(stored), casting="safe"):
            raise TypeError(f"cache[{i}] stores {stored}, which cannot hold the model's {dtype} keys and values")
        room = getattr(c, "max_seq_len", None)
        if room is not None and c.get_seq_length() + t_new > room:
            raise StaticCacheFullError(f"cache[{i}] is too short: {c.get_seq_length()} of max_seq_len={room} "
                                       f"positions used, input_ids bring {t_new} more")
        if isinstance(c, PagedCacheView):
            if c.token_ids is not None and _rows(c.token_ids) != ids.tolist():
                raise ValueError(f"cache[{i}].token_ids must be input_ids, the tokens written (prefix caching keys "
                                 f"blocks by them), got {_rows(c.token_ids)!r:.100} for input_ids "
                                 f"{ids.tolist()!r:.100}")
            c.check_room(t_new)
    lengths = [np.broadcast_to(c.get_seq_length(), (batch,)) for c in caches]  # an int, or [B] of a paged view
    if any(not np.array_equal(n, lengths[0]) for n in lengths):
        raise ValueError(f"cache: the layers hold different lengths {sorted({str(n.tolist())[:60] for n in lengths})}")


def _rows(token_ids):
    """``token_ids`` as lists of ints, row by row, ragged or not (None where they are not integers)."""
    try:
        return [[int(t) for t in row] for row in token_ids]
    except (TypeError, ValueError):
        return None


def _layout(cache):
    """``(batch_shape, k width, v width, storage dtype)`` of a layer's cache; None for what a DynamicCache
    has not fixed before its first update."""
    if isinstance(cache, PagedCacheView):
        pool = cache.cache
        return tuple(cache.batch_shape), pool.k_cache.shape[-1], pool.v_cache.shape[-1], pool.k_cache.dtype
    if isinstance(cache, QuantizedCache):  # no dequantize
        return tuple(cache.batch_shape), cache.k_dim, cache.v_dim, cache.dtype
    if cache.k_cache is None:
        return None, None, None, getattr(cache, "_dtype", None)
    return cache.k_cache.shape[:-2], cache.k_cache.shape[-1], cache.v_cache.shape[-1], cache.k_cache.dtype


# The model


def forward(config, weights, input_ids, *, cache=None):
    """Logits ``[B, T, vocab_size]`` of ``input_ids [B, T]``, continuing each layer's cache (the module's contract)."""
    ids = check_input_ids(config, input_ids)
    dtype = check_weights(config, weights)
    B, T = ids.shape
    check_cache(config, cache, ids, dtype)
    paged = isinstance(cache, PagedCacheView)
    start = 0 if cache is None else (cache if paged else cache[0]).get_seq_length()  # an int, or [B] of a paged view
    if T == 0 and not np.all(start):
        raise ValueError(f"input_ids must hold at least one token where the cache holds none, got shape {ids.shape}")
    positions = np.add.outer(start, np.arange(T)) if np.ndim(start) else start + np.arange(T)  # [T] or [B, T]
    cos, sin = rope_tables(positions, config.head_dim, config.rope_theta, dtype)  # [T, D] or [B, T, D]
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]: one row of positions per sequence
    eps = config.rms_norm_eps
    x = weights["model.embed_tokens.weight"][ids].astype(dtype)  # [B, T, D_model]
    layers = cache.layers(T) if paged else cache  # paged: the slots of the T tokens, taken once for every layer
    try:
        for i in range(config.num_hidden_layers):
            w = {name: weights[f"model.layers.{i}.{name}"].astype(dtype, copy=False) for name in LAYER_WEIGHTS}
            layer_cache = None if cache is None else layers[i]
            x = x + attention(config, w, rms_norm(x, w["input_layernorm.weight"], eps), cos, sin, start, layer_cache,
                              dtype)
            x = x + mlp(w, rms_norm(x, w["post_attention_layernorm.weight"], eps))
    except BaseException:  # e.g. NaN in a later layer's k, refused by its cache: the layers written are cropped back
        for c in [cache] if paged else cache or ():
            if np.any(c.get_seq_length() != start):
                c.crop(start)
        raise
    if paged:
        cache.cache_full_blocks()
    x = rms_norm(x, weights["model.norm.weight"].astype(dtype, copy=False), eps)
    head = weights["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    return linear(x, head.astype(dtype, copy=False))  # [B, T, vocab_size]


def generate(config, weights, input_ids, max_new_tokens, *, cache=None):
    """Greedy decoding: ``input_ids [B, T]`` and ``max_new_tokens`` argmax tokens, each fed back; int64 ``[B, T + N]``.

    With ``cache``, ``input_ids`` continue it: they are prefilled in one call, and each new
    token is one call; without, each step recomputes the whole prefix.
    """
    ids = check_input_ids(config, input_ids)
    max_new_tokens = as_size("max_new_tokens", max_new_tokens)
    if max_new_tokens and ids.shape[1] == 0:
        raise ValueError("input_ids must hold at least one token to generate from, got shape (B, 0)")
    if max_new_tokens and cache is not None:  # every step's room, known before the first writes
        check_cache(config, cache, ids, check_weights(config, weights))
        written = ids.shape[1] + max_new_tokens - 1  # the prompt, then each new token but the last
        for i, c in enumerate([cache] if isinstance(cache, PagedCacheView) else cache):
            room = getattr(c, "max_seq_len", None)
            if room is not None and c.get_seq_length() + written > room:
                raise StaticCacheFullError(f"cache[{i}] is too short for max_new_tokens={max_new_tokens}: "
                                           f"{c.get_seq_length()} of max_seq_len={room} positions used, the prompt "
                                           f"and the new tokens write {written} more")
            if isinstance(c, PagedCacheView):
                if c.token_ids is not None and max_new_tokens > 1:
                    raise ValueError(f"cache[{i}].token_ids name the prompt only; generate with max_new_tokens > 1 "
                                     f"feeds new tokens too: give views without token_ids")
                c.check_room(written)
    tokens, new = ids, ids
    for _ in range(max_new_tokens):
        logits = forward(config, weights, new if cache is not None else tokens, cache=cache)
        new = logits[:, -1].argmax(axis=-1)[:, None]  # [B, 1]
        tokens = np.concatenate([tokens, new], axis=1)  # [B, T + n]
    return tokens
