"""A Llama decoder (Hugging Face's ``LlamaForCausalLM``) whose attention runs through the library's caches.

``forward(config, weights, input_ids [B, T], cache=...)`` gives logits ``[B, T, vocab_size]``; ``weights`` are HF's
state dict (``[out_features, in_features]``); ``cache``, one object of every layer of batch shape ``(B,
num_key_value_heads)`` (HF 5's ``past_key_values``, or a paged view), is continued by ``input_ids``. Every call is
atomic (:func:`~kv_attention.cache.atomic`): whatever raises, the cache is as before and the error the original.
No call writes into, or keeps, a caller's array. What matches HF and gpt-fast, what differs, the errors:
docs/mechanisms.md#the-model.
"""

import dataclasses
import json
import os
import weakref

import numpy as np

from ._validation import as_flag, as_integer_array, as_real, as_size, check_finite_array
from .cache import DynamicCache, atomic
from .products import blas_threads, linear  # planned on the machine
from .sampling import sampler
from .speculative import SpecDecodingStats, prompt_lookup_candidates


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
    bos_token_id: int = None
    eos_token_id: object = None  # an id, or a tuple of ids (a list is taken): generate's default end tokens
    pad_token_id: int = None

    def __post_init__(self):
        for field in dataclasses.fields(self)[:6]:  # vocab_size .. num_key_value_heads
            as_size(field.name, getattr(self, field.name), minimum=1)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if as_size("head_dim", self.head_dim, minimum=1) % 2 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}, and num_attention_heads="
                             f"{self.num_attention_heads} a multiple of num_key_value_heads={self.num_key_value_heads}")
        as_real("rope_theta", self.rope_theta, 0, above=True), as_real("rms_norm_eps", self.rms_norm_eps, 0)
        as_flag("tie_word_embeddings", self.tie_word_embeddings)
        object.__setattr__(self, "eos_token_id", token_ids("eos_token_id", self.eos_token_id, self.vocab_size))
        token_ids("bos_token_id", self.bos_token_id, self.vocab_size, many=False)
        token_ids("pad_token_id", self.pad_token_id, self.vocab_size, many=False)

    @classmethod
    def from_json(cls, path):
        """The config of a Hugging Face ``config.json``; ValueError unless it is a plain Llama architecture."""
        if not isinstance(path, (str, bytes, os.PathLike)):  # an int would be opened as a file descriptor
            raise TypeError(f"path must be a path to a config.json, got {path!r}")
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict) or raw.get("model_type") != "llama" \
                or raw.get("architectures", ["LlamaForCausalLM"]) != ["LlamaForCausalLM"]:
            raise ValueError(f"{path}: not a Llama model's config.json (a JSON object of model_type 'llama'; only "
                             f"LlamaForCausalLM is supported), got {raw!r:.100}")
        rope = raw.pop("rope_parameters", None) or {}  # transformers 5 writes rope_theta in here
        if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default":
            raise ValueError(f"{path}: rope_parameters must be a JSON object of rope_type 'default', got {rope!r}")
        raw.setdefault("num_key_value_heads", raw.get("num_attention_heads"))  # LlamaConfig's default: MHA
        raw.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        for key, plain in dict(rope_scaling=None, attention_bias=False, mlp_bias=False, hidden_act="silu").items():
            if raw.get(key, plain) != plain:
                raise ValueError(f"{path}: {key}={raw[key]!r} is not supported (only {key}={plain!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


def token_ids(name, ids, vocab_size, many=True):
    """``ids`` (None, an id, or with ``many`` a list/tuple of ids) as None, an int or a tuple of ints; TypeError,
    ValueError for an id outside [0, vocab_size) or an empty list."""
    if ids is None:
        return None
    listed = many and isinstance(ids, (list, tuple))
    checked = tuple(as_size(name, i) for i in (ids if listed else [ids]))
    if not checked or max(checked) >= vocab_size:
        raise ValueError(f"{name} must be {'ids' if listed else 'an id'} in [0, vocab_size={vocab_size}), got {ids!r}")
    return checked if listed else checked[0]


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


def load_weights(path, dtype=None):
    """The tensors of a ``.safetensors`` file as NumPy arrays (``safetensors.numpy.load_file``), converted to
    ``dtype`` as they load (None: as stored; ``forward`` then converts a 16-bit weight once)."""
    from safetensors.numpy import load_file

    return {name: w if dtype is None else w.astype(dtype, copy=False) for name, w in load_file(path).items()}


def check_weights(config, weights):
    """The computation dtype (float64 for float64 weights, else float32); ValueError naming a bad weight."""
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict of Hugging Face state-dict names, got {type(weights).__name__}")
    shapes = weight_shapes(config)
    if shapes.keys() != weights.keys():  # at most 5 names of each
        raise ValueError(f"weights do not fit the config: missing {sorted(shapes.keys() - weights.keys())[:5]}, "
                         f"unexpected {sorted(weights.keys() - shapes.keys())[:5]}")
    for name, w in weights.items():
        if not isinstance(w, np.ndarray) or isinstance(w, np.ma.MaskedArray) or w.shape != shapes[name] \
                or not (w.dtype.kind == "f" or w.dtype.name == "bfloat16"):
            raise ValueError(f"weights[{name!r}] must be a float array of shape {shapes[name]}, "
                             f"got {getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    return np.dtype(np.float64 if {w.dtype for w in weights.values()} == {np.dtype(np.float64)} else np.float32)


_CONVERTED = {}  # id(weight) -> the weight in the compute dtype, while the weight lives


def converted(w, dtype, once=True):
    """Weight ``w`` in ``dtype``: with ``once``, converted the first time and kept while ``w`` lives (``w`` is
    then read-only, and so is any array it views, so that no write leaves the copy stale); else converted now and
    not kept."""
    if w.dtype == dtype or not once:
        return w.astype(dtype, copy=False)
    if id(w) not in _CONVERTED:
        _CONVERTED[id(w)] = w.astype(dtype)
        base = w
        while isinstance(base, np.ndarray):  # a view's buffer too: a write through it would change w
            base.flags.writeable, base = False, base.base
        weakref.finalize(w, _CONVERTED.pop, id(w), None)
    return _CONVERTED[id(w)]


# The layer

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


def attention(config, w, x, cos, sin, cache, layer_idx):
    """Grouped-query self-attention of ``x [B, T, D_model]`` through layer ``layer_idx`` of ``cache``: the same shape."""
    B, T, _ = x.shape
    H, H_kv, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = linear(x, w["self_attn.q_proj.weight"]).reshape(B, T, H, D).transpose(0, 2, 1, 3)  # [B, H, T, D]
    k = linear(x, w["self_attn.k_proj.weight"]).reshape(B, T, H_kv, D).transpose(0, 2, 1, 3)  # [B, H_kv, T, D]
    v = linear(x, w["self_attn.v_proj.weight"]).reshape(B, T, H_kv, D).transpose(0, 2, 1, 3)  # [B, H_kv, T, D]
    out = cache.attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, layer_idx)  # [B, H, T, D]
    out = out.astype(x.dtype, copy=False).transpose(0, 2, 1, 3).reshape(B, T, H * D)
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
    if ids.ndim != 2 or ids.max(initial=0) >= config.vocab_size:
        raise ValueError(f"input_ids must be [B, T] of ids in [0, vocab_size={config.vocab_size}), got shape "
                         f"{ids.shape}, ids up to {ids.max(initial=0)}")
    return ids


def check_cache(config, cache, ids, dtype, max_new_tokens=None):
    """Raise unless ``cache`` is None or takes this call's k, v ``[B, H_kv, T, D]`` in ``dtype`` (with
    ``max_new_tokens``: a generate's every token but the last), and unless T = 0 where there is no token to continue."""
    if cache is not None and not callable(getattr(cache, "attend", None)):
        raise TypeError(f"cache must be one object of every layer, a kv_attention.Cache (e.g. DynamicCache(): a list "
                        f"of one per layer is no longer taken) or a PagedCacheView, got {cache!r:.100}")
    (batch, t_new), d = ids.shape, config.head_dim
    if cache is not None:
        cache.check_update(config.num_hidden_layers, (batch, config.num_key_value_heads), d, d, dtype,
                           t_new if max_new_tokens is None else t_new + max_new_tokens - 1, ids)
    if t_new == 0 and (max_new_tokens or cache is None or not np.all(cache.get_seq_length())):
        raise ValueError(f"input_ids must hold at least one token to generate from, or where the cache holds none, "
                         f"got shape {ids.shape}")
    return cache


# The model


@blas_threads
def forward(config, weights, input_ids, *, cache=None, convert_once=True):
    """Logits ``[B, T, vocab_size]`` of ``input_ids [B, T]``, continuing ``cache``. ``convert_once``: a weight not in
    the compute dtype is converted once and kept (:func:`converted`); False converts each layer's on every call."""
    ids, dtype = check_input_ids(config, input_ids), check_weights(config, weights)
    cache, once = check_cache(config, cache, ids, dtype), as_flag("convert_once", convert_once)
    with atomic(cache, ids.shape[1]):
        return _forward(config, weights, ids, cache, dtype, once)


def _forward(config, weights, ids, cache, dtype, once):
    """:func:`forward` of checked arguments, inside a call's :func:`atomic` (None: a cache for this call only)."""
    cache = DynamicCache() if cache is None else cache
    start = cache.get_seq_length()  # an int, or [B] of a paged view
    positions = np.add.outer(start, np.arange(ids.shape[1]))  # [T] or [B, T]
    cos, sin = rope_tables(positions, config.head_dim, config.rope_theta, dtype)  # [T, D] or [B, T, D]
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]: one row of positions per sequence
    eps = config.rms_norm_eps
    x = weights["model.embed_tokens.weight"][ids].astype(dtype)  # [B, T, D_model]
    for i in range(config.num_hidden_layers):
        w = {name: converted(weights[f"model.layers.{i}.{name}"], dtype, once) for name in LAYER_WEIGHTS}
        x = x + attention(config, w, rms_norm(x, w["input_layernorm.weight"], eps), cos, sin, cache, i)
        x = x + mlp(w, rms_norm(x, w["post_attention_layernorm.weight"], eps))
    x = rms_norm(x, converted(weights["model.norm.weight"], dtype, once), eps)
    head = weights["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    logits = linear(x, converted(head, dtype, once))  # [B, T, vocab_size]
    check_finite_array("logits", logits)  # a NaN weight after the last cache write (its MLP, the norm, the head)
    return logits


@blas_threads
def generate(config, weights, input_ids, max_new_tokens, *, cache=None, convert_once=True,
             prompt_lookup_num_tokens=None, max_matching_ngram_size=None, eos_token_id=None, pad_token_id=None,
             do_sample=False, temperature=1.0, top_k=50, top_p=1.0, seed=None, streamer=None, attention_mask=None,
             use_cache=True):
    """``input_ids [B, T]`` and up to ``max_new_tokens`` tokens, int64 ``[B, T + N]``: one prefill, then one call a
    token through ``cache`` (room checked first; None: a DynamicCache of this call, HF's ``use_cache``), afterwards
    holding every token but the last (never fed). ``use_cache=False``: each step recomputes the prefix.

    HF's ``generate``: a row ends at ``eos_token_id`` (an id or a list; None: the config's, ``[]``: none), kept; rows
    ended earlier get ``pad_token_id`` (None: the config's, else the first end token); the call ends once every row
    has. Greedy, or ``do_sample`` (``temperature``, ``top_k``, ``top_p``, ``seed``: :mod:`~kv_attention.sampling`).
    ``streamer``: HF's, ``put(input_ids)``, ``put(new [B, m])`` after each forward, ``end()``.
    ``prompt_lookup_num_tokens=k`` (B = 1, a cache that crops): drafts of up to k tokens verified a call each, kept
    while equal to the chosen tokens (HF's rule: exact for sampling too, as for greedy). ``attention_mask``: for HF's
    ``generate(**tokenizer(text, return_tensors="np"))``, all ones (no padding here: ValueError otherwise)."""
    if attention_mask is not None and not np.array_equal(attention_mask, np.ones(np.shape(input_ids))):
        raise ValueError(f"attention_mask must be ones of input_ids' shape {np.shape(input_ids)}: padding is not "
                         f"supported (decode rows of other lengths in calls of their own, or serve them)")
    if not as_flag("use_cache", use_cache) and cache is not None:
        raise ValueError(f"use_cache=False decodes without a cache, but cache={cache!r:.60} was given")
    return _generate(config, weights, input_ids, max_new_tokens, DynamicCache() if use_cache and cache is None
                     else cache, convert_once, prompt_lookup_num_tokens, max_matching_ngram_size, eos_token_id,
                     pad_token_id, streamer,
                     dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))[0]


@blas_threads
def prompt_lookup_generate(config, weights, input_ids, max_new_tokens, *, cache, prompt_lookup_num_tokens=10,
                           max_matching_ngram_size=None, convert_once=True, eos_token_id=None, pad_token_id=None,
                           do_sample=False, temperature=1.0, top_k=50, top_p=1.0, seed=None, streamer=None):
    """:func:`generate` of ``input_ids [1, T]`` with prompt-lookup drafts, and its :class:`SpecDecodingStats`.
    ``cache``: one whose ``can_crop`` (DynamicCache, StaticCache, PagedCacheView), else TypeError; B > 1: ValueError."""
    return _generate(config, weights, input_ids, max_new_tokens, cache, convert_once, prompt_lookup_num_tokens,
                     max_matching_ngram_size, eos_token_id, pad_token_id, streamer,
                     dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))


def _generate(config, weights, input_ids, max_new_tokens, cache, convert_once, k, n, eos, pad, streamer, sampling):
    """Tokens and stats: each forward feeds the last token and a draft (none without k), keeps the draft's longest
    prefix equal to the chosen tokens, then the model's next one, up to an end token; the rest is cropped off."""
    ids, dtype = check_input_ids(config, input_ids), check_weights(config, weights)
    max_new_tokens, once = as_size("max_new_tokens", max_new_tokens), as_flag("convert_once", convert_once)
    if k is not None:
        k = as_size("prompt_lookup_num_tokens", k, minimum=1)
        n = 2 if n is None else as_size("max_matching_ngram_size", n, minimum=1)
        if ids.shape[0] != 1 or cache is None:
            raise ValueError(f"prompt lookup decodes one sequence, input_ids [1, T] (got shape {ids.shape}), and needs "
                             f"a cache to crop a rejected draft back from (got {cache!r:.40})")
    eos = np.array(end_tokens(config, eos), np.int64)
    pad = (config.pad_token_id if pad is None else token_ids("pad_token_id", pad, config.vocab_size, many=False))
    pad = int(eos[0]) if pad is None and eos.size else pad
    choose = sampler(**sampling)
    if streamer is not None and not all(callable(getattr(streamer, name, None)) for name in ("put", "end")):
        raise TypeError(f"streamer must have put() and end(), as Hugging Face's TextStreamer, got {streamer!r:.60}")
    stats, tokens, end = SpecDecodingStats(), ids.copy(), ids.shape[1] + max_new_tokens
    if max_new_tokens or cache is not None:  # a cache is checked even where no token is asked for
        cache = check_cache(config, cache, ids, dtype, max_new_tokens)
        if k is not None and not cache.can_crop:
            raise TypeError(f"prompt lookup needs a cache that crops a rejected draft back exactly (DynamicCache, "
                            f"StaticCache, PagedCacheView), got {type(cache).__name__}")
    if streamer is not None:
        streamer.put(ids.copy())
    if not max_new_tokens:
        streamer is None or streamer.end()
        return tokens, stats
    held, feed, draft = 0 if cache is None else np.max(cache.get_seq_length()), ids, ids[:, :0]
    done = np.zeros(ids.shape[0], bool)  # rows that produced an end token
    with atomic(cache, end - 1):
        while tokens.shape[1] < end and not done.all():
            logits = _forward(config, weights, tokens if cache is None else feed, cache, dtype, once)
            chosen = choose(logits[:, -1 - draft.shape[1] :])  # [B, 1 + d]: the token after each prefix
            accepted = 0
            while accepted < draft.shape[1] and (draft[:, accepted] == chosen[:, accepted]).all():
                accepted += 1
            stats.num_forwards += 1
            stats.num_drafts += draft.shape[1] > 0
            stats.num_draft_tokens += draft.shape[1]
            stats.num_accepted_tokens += accepted
            new = np.concatenate([draft[:, :accepted], chosen[:, accepted : accepted + 1]], axis=1)  # [B, m]
            if eos.size:
                new[done] = pad
                ends = np.isin(new, eos) & ~done[:, None]
                if ids.shape[0] == 1 and ends.any():  # a draft's tokens past the end token are dropped
                    new = new[:, : ends[0].argmax() + 1]
                done |= ends.any(axis=1)
            tokens = np.concatenate([tokens, new], axis=1)
            if new.shape[1] < 1 + draft.shape[1]:  # draft tokens rejected, or past an end token, leave every layer
                cache.crop(held + tokens.shape[1] - 1)
            if streamer is not None:
                streamer.put(new)
            if k is not None:  # up to the room left: a verifying forward yields one token beyond its draft
                draft = prompt_lookup_candidates(tokens[0], min(k, end - tokens.shape[1] - 1), n)[None]
            feed = np.concatenate([tokens[:, -1:], draft], axis=1)
        if streamer is not None:  # inside: an end() that raises undoes the call too
            streamer.end()
    return tokens, stats


def end_tokens(config, eos_token_id):
    """The end tokens of a call: ``eos_token_id`` (an id, a list; ``[]``: none) or, None, the config's, as a tuple."""
    if isinstance(eos_token_id, (list, tuple)) and not eos_token_id:
        return ()
    eos = config.eos_token_id if eos_token_id is None else token_ids("eos_token_id", eos_token_id, config.vocab_size)
    return () if eos is None else eos if isinstance(eos, tuple) else (eos,)
