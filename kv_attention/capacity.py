"""KV cache capacity: the bytes a decoder's K/V cache holds, and the shapes of some real models.

    bytes = 2 × n_layers × n_kv_heads × head_dim × seq_len × batch × itemsize

(Pope et al. 2022, "Efficiently Scaling Transformer Inference"; vLLM, Kwon et al.
2023). Query heads do not appear: sharing K/V heads (GQA, MQA) is what shrinks the
cache. Counts are integers (TypeError) at or above their minimum (ValueError).
"""

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from ._validation import as_size


# Element types of real servers that numpy has no dtype for, with their bytes: ml_dtypes' names
# (vLLM's kv_cache_dtype "fp8" stores E4M3, "fp8_e5m2" E5M2). Sub-byte formats are stored packed: not here.
NAMED_ITEMSIZES = MappingProxyType({
    "bfloat16": 2,
    "float8": 1,  # any 8-bit float
    **{f"float8_{variant}": 1 for variant in (
        "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "e4m3", "e3m4", "e5m3fnu", "e8m0fnu")},
})


def as_itemsize(dtype, named):
    """Bytes per element of a float or integer numpy ``dtype`` or of a name in ``named`` (an ml_dtypes dtype: by its
    name or its family's, ``float8_e5m3fnu``)."""
    if isinstance(dtype, str) and dtype in named:
        return named[dtype]
    names = f"a name in NAMED_ITEMSIZES ({', '.join(map(repr, list(named)[:3]))}, ...)"
    if dtype is None:
        raise TypeError(f"dtype must be a numeric numpy dtype such as np.float16 or {names}, got None")
    try:
        dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be a numeric numpy dtype such as np.float16 or {names}, got {dtype!r}: {error}") from None
    if dtype.name in named:
        return named[dtype.name]
    family = dtype.name.partition("_")[0]
    if family in named and dtype.itemsize == named[family]:
        return dtype.itemsize
    if dtype.kind not in "fiu":
        raise TypeError(f"dtype must be a float or integer dtype, got {dtype} (or {names})")
    return dtype.itemsize


def kv_cache_bytes(*, batch, seq_len, n_layers, n_kv_heads, head_dim, dtype):
    """Logical size of a K/V cache in bytes, an exact int. ``batch``, ``seq_len`` >= 0; ``n_layers``, ``n_kv_heads``,
    ``head_dim`` >= 1; ``dtype`` a float or integer numpy dtype or a name of :data:`NAMED_ITEMSIZES`."""
    counts = dict(batch=(batch, 0), seq_len=(seq_len, 0), n_layers=(n_layers, 1), n_kv_heads=(n_kv_heads, 1),
                  head_dim=(head_dim, 1))
    sizes = [as_size(name, value, minimum) for name, (value, minimum) in counts.items()]
    total = 2 * as_itemsize(dtype, NAMED_ITEMSIZES)
    for size in sizes:
        total *= size
    return total


@dataclass(frozen=True)
class ModelShape:
    """The attention shape of a decoder model: layers, query heads H_q, K/V heads H_kv, D_head."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    def __post_init__(self):
        for name in ("n_layers", "n_heads", "n_kv_heads", "head_dim"):
            as_size(name, getattr(self, name), minimum=1)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")

    def kv_cache_bytes(self, *, batch=1, seq_len=1, dtype=np.float16):
        """:func:`kv_cache_bytes` for this model; by default the bytes per token at fp16."""
        return kv_cache_bytes(batch=batch, seq_len=seq_len, n_layers=self.n_layers, n_kv_heads=self.n_kv_heads,
                              head_dim=self.head_dim, dtype=dtype)


# From each model's published config.json (num_hidden_layers, num_attention_heads, num_key_value_heads,
# hidden_size / num_attention_heads).
MODEL_SHAPES = MappingProxyType({  # read-only: the library's table, not the caller's
    "Llama-2-7B": ModelShape(n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128),  # MHA
    "Llama-3-8B": ModelShape(n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128),  # GQA, G = 4
    "Llama-2-70B": ModelShape(n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128),  # GQA, G = 8
})
