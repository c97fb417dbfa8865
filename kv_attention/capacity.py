"""KV cache capacity: the bytes a decoder's K/V cache holds, and the shapes of some real models.

A decoder keeps, for every layer, every K/V head and every position of every
sequence, one key and one value of ``head_dim`` elements:

    bytes = 2 × n_layers × n_kv_heads × head_dim × seq_len × batch × itemsize

(the accounting of Pope et al. 2022, "Efficiently Scaling Transformer Inference",
and of vLLM, Kwon et al. 2023, "Efficient Memory Management for Large Language
Model Serving with PagedAttention"). Query heads do not appear: sharing
K/V heads (GQA, MQA) is what shrinks the cache.

A count below its minimum raises ValueError naming it and its value; a count that
is not an integer, or a dtype that is neither numeric nor one of
:data:`NAMED_ITEMSIZES`, raises TypeError.
"""

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from ._validation import as_size


# Cache element types of real servers that numpy has no dtype for, by name, with their bytes per
# element. The float8 names are ml_dtypes' (the OCP 8-bit formats E4M3FN and E5M2 and their
# variants; vLLM's kv_cache_dtype "fp8" stores E4M3, "fp8_e5m2" E5M2); importing ml_dtypes makes
# them numpy dtypes, which are accepted too, as is any 1-byte dtype named float8_<variant> that a
# later ml_dtypes adds. Sub-byte formats (float4, int4) are not: they are stored packed, and this
# count is in whole bytes per element.
NAMED_ITEMSIZES = MappingProxyType({
    "bfloat16": 2,
    "float8": 1,  # any 8-bit float
    **{f"float8_{variant}": 1 for variant in (
        "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "e4m3", "e3m4", "e5m3fnu", "e8m0fnu")},
})


def as_itemsize(dtype, named):
    """Bytes per element of ``dtype``: a float or integer numpy dtype, or a name in ``named`` (name -> bytes).

    A dtype whose name is in ``named`` (as ml_dtypes registers ``bfloat16``) counts
    as that name, and one named ``<family>_<variant>`` whose family is in ``named``
    with its size (``float8_e5m3fnu``, 1 byte) counts as the family. TypeError for
    anything else, None included (``np.dtype(None)`` would silently mean float64).
    """
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


def check_model_shape(n_layers, n_heads, n_kv_heads, head_dim):
    """Raise unless every count is an integer >= 1 and n_kv_heads divides n_heads."""
    counts = {"n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim}
    for name, n in counts.items():
        as_size(name, n, minimum=1)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")


def kv_cache_bytes(*, batch, seq_len, n_layers, n_kv_heads, head_dim, dtype):
    """Logical size of a K/V cache in bytes, as a Python int (exact, never overflows).

    ``batch`` and ``seq_len`` >= 0; ``n_layers``, ``n_kv_heads``, ``head_dim`` >= 1.
    ``dtype``: anything ``np.dtype`` accepts with a float or integer kind, e.g.
    ``np.float16`` (2 bytes) or ``np.int8``, or a name of :data:`NAMED_ITEMSIZES`:
    ``"bfloat16"`` (2 bytes), ``"float8"`` or ``"float8_e4m3fn"`` (1 byte), as a
    string or as the ml_dtypes dtype of that name. A one-layer
    ``StaticCache((B, n_kv_heads), T, head_dim, head_dim, dtype)`` filled to T
    positions has this ``nbytes``.
    """
    counts = {"batch": (batch, 0), "seq_len": (seq_len, 0), "n_layers": (n_layers, 1)}
    counts.update(n_kv_heads=(n_kv_heads, 1), head_dim=(head_dim, 1))
    sizes = [as_size(name, value, minimum) for name, (value, minimum) in counts.items()]
    total = 2 * as_itemsize(dtype, NAMED_ITEMSIZES)
    for size in sizes:
        total *= size
    return total


@dataclass(frozen=True)
class ModelShape:
    """The attention shape of a decoder model: what its K/V cache size depends on.

    Attributes:
        n_layers: decoder layers, each with its own K/V cache.
        n_heads: query heads per layer (H_q).
        n_kv_heads: K/V heads per layer (H_kv); n_heads // n_kv_heads query heads share each.
        head_dim: D_head.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    def __post_init__(self):
        """Every count must be an integer >= 1, and n_kv_heads must divide n_heads."""
        check_model_shape(self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim)

    def kv_cache_bytes(self, *, batch=1, seq_len=1, dtype=np.float16):
        """:func:`kv_cache_bytes` for this model; by default the bytes per token at fp16."""
        return kv_cache_bytes(
            batch=batch, seq_len=seq_len, n_layers=self.n_layers,
            n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, dtype=dtype,
        )


# From each model's published config.json (num_hidden_layers, num_attention_heads,
# num_key_value_heads, hidden_size / num_attention_heads): Touvron et al. 2023, "Llama 2"
# (GQA in the 70B model), and Llama Team 2024, "The Llama 3 Herd of Models".
MODEL_SHAPES = MappingProxyType({  # read-only: the library's table, not the caller's
    "Llama-2-7B": ModelShape(n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128),  # MHA
    "Llama-3-8B": ModelShape(n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128),  # GQA, G = 4
    "Llama-2-70B": ModelShape(n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128),  # GQA, G = 8
})
