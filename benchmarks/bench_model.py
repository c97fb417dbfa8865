"""Model experiment: the decode step of a whole decoder at SmolLM-135M's shape, through the commit's ``forward``.

The model is SmolLM-135M's configuration (:data:`CONFIGS`: 30 layers, hidden 576,
9 query heads over 3 K/V heads of 64, SwiGLU 1,536, vocabulary 49,152, tied
embeddings) with float32 weights drawn here, from ``default_rng([42, 8, ...])``
as the roofline's int8 draws (``bench_roofline.draws``), identical for every
commit: a matrix ``[out, in]`` uniform with variance 1 / in, the embedding
with variance 1 / hidden (the tied lm_head's logits stay of order one), the
norms ones. One step is one new token per sequence, ``forward(config,
weights, ids [B, 1], cache=caches)``, against one cache per layer already
holding T positions. The caches are filled by ``update`` with drawn K and V
``[B, 3, T, 64]`` (never by a prefill through the model), and put back to T
positions after each step (a StaticCache by ``crop``, a DynamicCache by
restoring its arrays, so no step pays a copy a decode would not).

The bytes a step must read (:func:`step_bytes`): every weight once (a tied
model's embedding is its lm_head, read whole) and K and V of T + 1 positions
per layer. Beside them, each cache kind's bytes per token, exact. The weights
against a token's K/V (:data:`CONFIGS`, Llama-3-8B's too) and the batch x
length at which the cache outweighs the weights are arithmetic, the same at
every commit: the report computes them, no benchmark tracks them.

Before timing, each point's step is checked against :func:`step_oracle`, one
decode step written here in float64 from Hugging Face's ``modeling_llama.py``
(RMSNorm, ``rotate_half`` RoPE on q and the new k, query head h on K/V head
h // G, SwiGLU, the tied lm_head) over the same cached K and V: the timed
computation itself, at its own T and B, with all 30 layers.
"""

import functools
import math

import numpy as np

from . import bench_roofline  # the module, not its class: asv would collect an imported Roofline here again
from .bench_roofline import bandwidth_fraction, draws
from .common import Benchmark, SEED, check_points, library_function, read_only, verified_decode
from .ratios import Ratios

# Hugging Face config.json fields (ModelConfig's names). SmolLM-135M: HuggingFaceTB/SmolLM-135M; Llama-3-8B:
# meta-llama/Meta-Llama-3-8B. Llama-3-8B is never built: its bytes are counted, for the crossover.
CONFIGS = {
    "SmolLM-135M": {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "rope_theta": 10000.0,
                    "rms_norm_eps": 1e-5, "tie_word_embeddings": True},
    "Llama-3-8B": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 500000.0,
                   "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
}
MODEL = "SmolLM-135M"  # the one built and timed
ITEMSIZES = {"SmolLM-135M": 4, "Llama-3-8B": 2}  # bytes of a weight and a cached element: float32 here; bf16 served
# T of the step's time and bandwidth fraction, B = 1: K/V are 2 % and 26 % of the step's bytes. T = 1024 (8 %) was
# within the intervals of T = 256 for dynamic and static, and cost 3 s a commit.
STEP_LENGTHS = [256, 4096]
STEP_CACHES = ["dynamic", "static", "float16"]  # float16: a StaticCache storing 2 bytes an element
STORAGE = {"static": np.float32, "float16": np.float16}  # the StaticCache kinds' storage dtype
BATCH_LENGTH = 256  # T of the batch sweep: the weights are 95 % of a B = 8 step's bytes
BATCH_SIZES = [1, 2, 4, 8]
TAG = 8  # the experiment's first seed part after SEED (the roofline's draws use 1 to 7)
# rtol = atol of the check: float32 logits of order one against the float64 oracle after 30 layers (measured: below
# 2e-5); a float16 cache also stores the new position's K and V rounded by up to 2^-11 (measured: 1e-3 at T = 256).
TOLERANCE = {"dynamic": 1e-4, "static": 1e-4, "float16": 4e-3}
BYTES_LENGTH = 1024  # T at which a cache's bytes per token are read
CACHE_KINDS = {  # (batch_shape, head_dim) -> an empty cache of the commit, float32
    "dynamic": lambda shape, d: library_function("DynamicCache")(),
    "static": lambda shape, d: static_cache(shape, BYTES_LENGTH, d, np.float32),
    "quantized": lambda shape, d: library_function("QuantizedCache")(shape, d, d, nbits=4, dtype=np.float32),
    "float16": lambda shape, d: static_cache(shape, BYTES_LENGTH, d, np.float16),
}


def weight_shapes(name):
    """``{Hugging Face state-dict name: [out, in] or [n]}`` of ``CONFIGS[name]``, the lm_head only if untied."""
    c = CONFIGS[name]
    hidden, q, kv = c["hidden_size"], c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    layer = {"input_layernorm": (hidden,), "self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden),
             "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, q), "post_attention_layernorm": (hidden,),
             "mlp.gate_proj": (c["intermediate_size"], hidden), "mlp.up_proj": (c["intermediate_size"], hidden),
             "mlp.down_proj": (hidden, c["intermediate_size"])}
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], hidden)}
    for i in range(c["num_hidden_layers"]):
        shapes.update({f"model.layers.{i}.{part}.weight": shape for part, shape in layer.items()})
    shapes["model.norm.weight"] = (hidden,)
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], hidden)
    return shapes


def weight_bytes(name):
    """The weights one step reads whole, at ``ITEMSIZES[name]``: all but an untied embedding (B rows of it are read)."""
    shapes = weight_shapes(name)
    if not CONFIGS[name]["tie_word_embeddings"]:
        del shapes["model.embed_tokens.weight"]
    return ITEMSIZES[name] * sum(math.prod(s) for s in shapes.values())


def kv_bytes_per_token(name):
    """K and V of one token in every layer: 2 x layers x K/V heads x head_dim x itemsize."""
    c = CONFIGS[name]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * ITEMSIZES[name]


def crossover(name):
    """B x T at which the cache a step reads equals the weights it reads: weight_bytes / kv_bytes_per_token."""
    return weight_bytes(name) / kv_bytes_per_token(name)


def step_bytes(t_len, batch):
    """What one step of MODEL must read: the weights once and K and V of T + 1 positions of each sequence."""
    return weight_bytes(MODEL) + batch * (t_len + 1) * kv_bytes_per_token(MODEL)


def model_config():
    """The commit's ``ModelConfig`` of MODEL; NotImplementedError (skip) on a commit without the model."""
    library_function("forward")
    return library_function("ModelConfig")(**CONFIGS[MODEL])


@functools.lru_cache(maxsize=1)
def model_weights():
    """MODEL's float32 weights (module docstring), read-only: 538 MB, drawn once per process."""
    weights = {}
    for i, (key, shape) in enumerate(weight_shapes(MODEL).items()):
        if len(shape) == 1:
            weights[key] = read_only(np.ones(shape, np.float32))[0]
        else:  # uniform int8 / 128 has variance 1/3: times sqrt(3 / fan), fan = in (the embedding: hidden)
            weights[key] = draws((TAG, 0, i), shape, math.sqrt(3 / shape[-1]))
    assert sum(w.nbytes for w in weights.values()) == weight_bytes(MODEL), "weight_shapes and weight_bytes disagree"
    return weights


def token_ids(batch):
    """The new token of each of ``batch`` sequences, ``[B, 1]`` int64: the first B of 8 seeded ids."""
    return np.random.default_rng([SEED, TAG, 1]).integers(0, CONFIGS[MODEL]["vocab_size"], (8, 1))[:batch]


@functools.lru_cache(maxsize=1)
def cached_kv(t_len, rows):
    """``[(K, V)]`` per layer, each ``[rows, H_kv, T, D_head]`` float32 in [-1, 1): sequence b's are those of any B."""
    c = CONFIGS[MODEL]
    shape = (rows, c["num_key_value_heads"], t_len, c["head_dim"])
    return [(draws((TAG, 2, layer, t_len), shape), draws((TAG, 3, layer, t_len), shape))
            for layer in range(c["num_hidden_layers"])]


def kv_rows(t_len):
    """How many sequences' K/V are drawn at T: 8 at the batch sweep's T, else 1."""
    return max(BATCH_SIZES) if t_len == BATCH_LENGTH else 1


def static_cache(batch_shape, max_seq_len, head_dim, dtype):
    """The commit's StaticCache storing ``dtype``; NotImplementedError (skip) where it stores no float16."""
    try:
        return library_function("StaticCache")(batch_shape, max_seq_len, head_dim, head_dim, dtype)
    except TypeError as error:
        if dtype != np.float16:
            raise
        raise NotImplementedError(f"StaticCache stores no float16 at this commit ({error})") from None


def filled_caches(kind, t_len, batch):
    """One cache of ``kind`` per layer holding the drawn K and V of T positions of B sequences, and ``restore()``."""
    c = CONFIGS[MODEL]
    caches = []
    for k, v in cached_kv(t_len, kv_rows(t_len)):
        if kind in STORAGE:
            cache = static_cache((batch, c["num_key_value_heads"]), t_len + 1, c["head_dim"], STORAGE[kind])
        else:
            cache = library_function("DynamicCache")()
        cache.update(k[:batch], v[:batch])
        caches.append(cache)
    if kind in STORAGE:
        return caches, lambda: [cache.crop(t_len) for cache in caches]
    kept = [(cache.k_cache, cache.v_cache) for cache in caches]

    def restore():  # the arrays before the step: np.concatenate made new ones, the old stay as they were
        for cache, (k, v) in zip(caches, kept):
            cache.k_cache, cache.v_cache = k, v

    return caches, restore


def rope(x, position, head_dim, theta):
    """``x · cos + rotate_half(x) · sin`` at ``position``, ``x [..., D_head]`` float64 (Hugging Face's Llama)."""
    angles = position * theta ** (-np.arange(0, head_dim, 2) / head_dim)  # [D_head / 2]
    cos, sin = np.cos(np.concatenate([angles, angles])), np.sin(np.concatenate([angles, angles]))
    half = head_dim // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def step_oracle(c, weights, ids, kv, t_len):
    """One decode step of config ``c`` written independently of kv_attention, float64: logits ``[B, 1, vocab]``.

    ``weights``: Hugging Face's names, each product taken in float64; ``ids [B, 1]``; ``kv``: per layer ``(K, V)`` ``[>= B, H_kv, T, D_head]``, the T
    cached positions (their first B sequences). The new token sits at position T.
    """
    batch = len(ids)
    n_heads, n_kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]

    def norm(x, key):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c["rms_norm_eps"]) * weights[key]

    def linear(x, key):  # x [B, in] float64 @ W.T, W [out, in] float32: numpy takes the product in float64
        return x @ weights[key].T

    h = weights["model.embed_tokens.weight"][ids[:, 0]].astype(np.float64)  # [B, hidden]
    for i, (k_cached, v_cached) in enumerate(kv):
        p = f"model.layers.{i}."
        x = norm(h, p + "input_layernorm.weight")
        q = rope(linear(x, p + "self_attn.q_proj.weight").reshape(batch, n_kv, n_heads // n_kv, d), t_len, d,
                 c["rope_theta"])  # [B, H_kv, G, D]: query head h reads K/V head h // G
        k = rope(linear(x, p + "self_attn.k_proj.weight").reshape(batch, n_kv, 1, d), t_len, d, c["rope_theta"])
        v = linear(x, p + "self_attn.v_proj.weight").reshape(batch, n_kv, 1, d)
        keys = np.concatenate([k_cached[:batch].astype(np.float64), k], axis=2)  # [B, H_kv, T + 1, D]
        values = np.concatenate([v_cached[:batch].astype(np.float64), v], axis=2)
        scores = q @ keys.swapaxes(-1, -2) / math.sqrt(d)  # [B, H_kv, G, T + 1]
        p_attn = np.exp(scores - scores.max(axis=-1, keepdims=True))
        heads = (p_attn / p_attn.sum(axis=-1, keepdims=True)) @ values  # [B, H_kv, G, D]
        h = h + linear(heads.reshape(batch, n_heads * d), p + "self_attn.o_proj.weight")
        x = norm(h, p + "post_attention_layernorm.weight")
        gate = linear(x, p + "mlp.gate_proj.weight")
        h = h + linear(gate / (1 + np.exp(-gate)) * linear(x, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
    head = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"
    return linear(norm(h, "model.norm.weight"), head)[:, None, :]


@functools.lru_cache(maxsize=1)
def expected_logits(t_len):
    """The oracle's logits at T for all ``kv_rows(T)`` sequences (a B < 8 point checks the first B)."""
    rows = kv_rows(t_len)
    return step_oracle(CONFIGS[MODEL], model_weights(), token_ids(rows), cached_kv(t_len, rows), t_len)


def verified_step(kind, t_len, batch):
    """``step()``: one decode step of B sequences through caches of ``kind`` holding T, once it matched the oracle."""
    config, forward, weights, ids = model_config(), library_function("forward"), model_weights(), token_ids(batch)
    caches, restore = filled_caches(kind, t_len, batch)

    def step():
        try:
            return forward(config, weights, ids, cache=caches)
        finally:
            restore()

    def checked():
        out = step()
        assert out.dtype == np.float32, f"float32 weights gave {out.dtype} logits"
        assert caches[0].get_seq_length() == t_len, f"the caches hold {caches[0].get_seq_length()}, not {t_len}"
        return out.astype(np.float64)

    verified_decode(f"model step, {kind} cache, T={t_len}, B={batch}", checked, (),
                    lambda: expected_logits(t_len)[:batch], rtol=TOLERANCE[kind], atol=TOLERANCE[kind])
    return step


def read_kernel(t_len, batch):
    """A callable reading every weight and a K/V-sized buffer once (``np.vdot(a, a)``, as the roofline's), its bytes."""
    kv = np.ones(batch * (t_len + 1) * kv_bytes_per_token(MODEL) // 4, np.float32)  # written, so resident
    arrays = [*model_weights().values(), kv]
    nbytes = sum(a.nbytes for a in arrays)
    assert nbytes == step_bytes(t_len, batch), f"the read kernel reads {nbytes} bytes"
    return (lambda: [np.vdot(a, a) for a in arrays]), nbytes


def measure_step(T, cache):
    """The bandwidth fraction of one B = 1 step through caches of ``cache`` holding T (``bandwidth_fraction``)."""
    step = verified_step(cache, T, 1)
    read, nbytes = read_kernel(T, 1)
    return bandwidth_fraction(step, read, nbytes, 0, bench_roofline.Roofline.min_pairs)


def measure_batch(B):
    """B x time(B = 1) / time(B) of the static-cache step at BATCH_LENGTH, with its interval, and B / time(B).

    Paired as the step's fraction is (``bandwidth_fraction``: a warm-up call each, then Roofline.min_pairs pairs of
    one call a side), the B = 1 step in the read kernel's place: its ratio is time(1) / time(B) per pair, and its
    "rate" over B "bytes" is B over the B-sequence step's median time.
    """
    one, many = verified_step("static", BATCH_LENGTH, 1), verified_step("static", BATCH_LENGTH, B)
    paired = bandwidth_fraction(many, one, B, 0, bench_roofline.Roofline.min_pairs)
    return {"ratio": B * paired["ratio"], "low": B * paired["low"], "high": B * paired["high"],
            "pairs": paired["pairs"], "positions_per_second": paired["step_gbps"] * 1e9}


STEP_PARAMS = [STEP_LENGTHS, STEP_CACHES]  # T outermost: each T's K/V drawn and its oracle run once
BATCH_PARAMS = [BATCH_SIZES[1:]]


class _Measured:
    """Both timed classes' one ``setup_cache``: defined once here, so asv runs it once per commit for both (its
    key is the place of definition), and the weights are drawn once. Not collected by asv (a leading ``_``)."""

    timeout = 300

    def setup_cache(self):
        batch = check_points(BATCH_PARAMS, measure_batch)  # first: T = 256's K/V and oracle serve the steps' too
        return {"batch": batch, "step": check_points(STEP_PARAMS, measure_step)}


class ModelStep(_Measured, bench_roofline.Roofline):
    """One decode step of the whole model at B = 1, per cache kind and T: its time, and its fraction of the read rate.

    As the roofline's points (``track_ratio`` the fraction, ``track_step_gbps``, ``track_read_gbps``), with the
    time per token beside them.
    """

    params = STEP_PARAMS
    param_names = ["T", "cache"]

    def setup(self, measured, *point):
        super().setup(measured["step"], *point)

    def track_token_seconds(self, measured, T, cache):
        """Seconds per token: the step's median time in the pairs (its bytes over its rate)."""
        return self.measured["bytes"] / self.tracked("step_gbps") / 1e9

    track_token_seconds.unit = "seconds"
    track_token_seconds.version = "1"


class ModelBatch(_Measured, Ratios):
    """Positions/s of the decode step at B over that of B = 1, static caches at T = 256: B x time(1) / time(B), paired.

    ``track_positions_per_second``: B over the B-sequence step's median time in the same pairs.
    """

    params = BATCH_PARAMS
    param_names = ["B"]

    def setup(self, measured, *point):
        super().setup(measured["batch"], *point)

    def sides(self, B):  # measured by measure_batch in the shared setup_cache
        raise NotImplementedError

    def track_positions_per_second(self, measured, B):
        """B over the median time of the B-sequence step in the pairs (one new position of each sequence)."""
        return self.measured["positions_per_second"]

    track_positions_per_second.unit = "positions/s"
    track_positions_per_second.version = "1"


class ModelCacheBytes(Benchmark):
    """Bytes per token of each cache kind at SmolLM-135M's shape, exact: 30 layers x one layer's ``nbytes`` / T.

    One layer's cache of B = 1, ``batch_shape (1, 3)``, holding T = 1024 positions of float32 K and V; quantized: a
    4-bit QuantizedCache of group 32 and residual 32 with float32 scales (its residual included).
    """

    params = [list(CACHE_KINDS)]
    param_names = ["cache"]

    def setup(self, cache):
        c = CONFIGS[MODEL]
        layer = CACHE_KINDS[cache]((1, c["num_key_value_heads"]), c["head_dim"])
        kv = np.ones((1, c["num_key_value_heads"], BYTES_LENGTH, c["head_dim"]), np.float32)
        layer.update(kv, kv)
        self.per_token = c["num_hidden_layers"] * layer.nbytes / BYTES_LENGTH

    def track_bytes_per_token(self, cache):
        return self.per_token

    track_bytes_per_token.unit = "bytes"
    track_bytes_per_token.version = "1"
