"""kv_cache_bytes and the real-model table, against figures worked out by hand."""

import numpy as np
import pytest

import kv_attention as kv

KIB, GIB = 2**10, 2**30


@pytest.mark.parametrize(
    "model, n_layers, n_heads, n_kv_heads, per_token, at_4096",
    [
        # 2 x layers x KV heads x 128 x 2 bytes; x 4096 positions
        ("Llama-2-7B", 32, 32, 32, 512 * KIB, 2 * GIB),
        ("Llama-3-8B", 32, 32, 8, 128 * KIB, GIB // 2),
        ("Llama-2-70B", 80, 64, 8, 320 * KIB, 5 * GIB // 4),
    ],
)
def test_real_models_at_fp16(model, n_layers, n_heads, n_kv_heads, per_token, at_4096):
    shape = kv.MODEL_SHAPES[model]
    assert shape == kv.ModelShape(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=128)
    assert shape.kv_cache_bytes() == per_token  # defaults: one token of one sequence, fp16
    assert shape.kv_cache_bytes(batch=1, seq_len=4096, dtype=np.float16) == at_4096
    assert kv.kv_cache_bytes(
        batch=1, seq_len=4096, n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=128, dtype="float16"
    ) == at_4096


def test_the_formula_is_linear_in_every_factor():
    base = dict(batch=4, seq_len=1024, n_layers=1, n_kv_heads=2, head_dim=16, dtype=np.float64)
    assert kv.kv_cache_bytes(**base) == 2 * 4 * 1024 * 1 * 2 * 16 * 8 == 2 * 2**20
    for name in ("batch", "seq_len", "n_layers", "n_kv_heads", "head_dim"):
        assert kv.kv_cache_bytes(**{**base, name: 3 * base[name]}) == 3 * kv.kv_cache_bytes(**base), name
    assert kv.kv_cache_bytes(**{**base, "dtype": np.float32}) * 2 == kv.kv_cache_bytes(**base)
    assert kv.kv_cache_bytes(**{**base, "dtype": np.int8}) * 8 == kv.kv_cache_bytes(**base)


def test_an_empty_cache_holds_zero_bytes():
    assert kv.kv_cache_bytes(batch=2, seq_len=0, n_layers=4, n_kv_heads=2, head_dim=8, dtype=np.float16) == 0
    assert kv.kv_cache_bytes(batch=0, seq_len=9, n_layers=4, n_kv_heads=2, head_dim=8, dtype=np.float16) == 0


@pytest.mark.parametrize("dtype, itemsize", [("bfloat16", 2), ("float8", 1), ("float8_e4m3fn", 1), ("float8_e5m2", 1)])
def test_named_dtypes_numpy_lacks(dtype, itemsize):
    # Llama-3-8B at T = 4096: 2 x 32 layers x 8 KV heads x 128 x 4096 positions = 2**28 elements.
    shape = kv.MODEL_SHAPES["Llama-3-8B"]
    assert shape.kv_cache_bytes(seq_len=4096, dtype=dtype) == 2**28 * itemsize
    assert kv.kv_cache_bytes(batch=3, seq_len=5, n_layers=1, n_kv_heads=1, head_dim=7, dtype=dtype) == 210 * itemsize


def test_the_named_dtypes_are_ml_dtypes_own_names_and_sizes():
    # ml_dtypes registers these types with numpy under exactly these names; its dtypes count as the names.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ours = {name: size for name, size in kv.NAMED_ITEMSIZES.items() if name != "float8"}
    for name, size in ours.items():
        if not hasattr(ml_dtypes, name):  # a format newer than the installed ml_dtypes
            continue
        dtype = np.dtype(getattr(ml_dtypes, name))
        assert (dtype.name, dtype.itemsize) == (name, size)
        assert kv.kv_cache_bytes(batch=1, seq_len=3, n_layers=1, n_kv_heads=1, head_dim=5, dtype=dtype) == 30 * size
    eight_bit = {n for n in dir(ml_dtypes) if n.startswith("float8_") and np.dtype(getattr(ml_dtypes, n)).itemsize == 1}
    assert {"float8_e4m3fn", "float8_e5m2"} <= eight_bit
    for name in eight_bit:  # every 8-bit float this ml_dtypes knows, listed in ours or not
        dtype = np.dtype(getattr(ml_dtypes, name))
        assert kv.kv_cache_bytes(batch=1, seq_len=3, n_layers=1, n_kv_heads=1, head_dim=5, dtype=dtype) == 30
    with pytest.raises(TypeError, match="dtype must be a float or integer dtype, got float4_e2m1fn"):
        kv.kv_cache_bytes(batch=1, seq_len=3, n_layers=1, n_kv_heads=1, head_dim=5, dtype=ml_dtypes.float4_e2m1fn)


def test_the_named_dtype_table_is_read_only():
    with pytest.raises(TypeError):
        kv.NAMED_ITEMSIZES["fp4"] = 1


def test_huge_caches_are_exact_integers():
    shape = kv.MODEL_SHAPES["Llama-2-70B"]
    assert shape.kv_cache_bytes(batch=10**6, seq_len=10**6) == 327680 * 10**12


@pytest.mark.parametrize(
    "name, value, error, message",
    [
        ("n_layers", 0, ValueError, r"n_layers must be >= 1, got 0"),
        ("n_kv_heads", -8, ValueError, r"n_kv_heads must be >= 1, got -8"),
        ("head_dim", 0, ValueError, r"head_dim must be >= 1, got 0"),
        ("batch", -1, ValueError, r"batch must be >= 0, got -1"),
        ("seq_len", -4096, ValueError, r"seq_len must be >= 0, got -4096"),
        ("head_dim", 128.0, TypeError, r"head_dim must be an integer, got 128.0"),
        ("dtype", None, TypeError, r"dtype must be a numeric numpy dtype"),
        ("dtype", "bfloat17", TypeError, r"dtype must be a numeric numpy dtype .*'bfloat17'"),
        ("dtype", "float4_e2m1fn", TypeError, r"dtype must be .*float4_e2m1fn"),  # sub-byte: stored packed
        ("dtype", "Float8", TypeError, r"dtype must be a numeric numpy dtype .*'Float8'"),
        ("dtype", object, TypeError, r"dtype must be a float or integer dtype, got object"),
        ("dtype", np.bool_, TypeError, r"dtype must be a float or integer dtype, got bool"),
    ],
)
def test_bad_arguments(name, value, error, message):
    args = dict(batch=1, seq_len=4096, n_layers=32, n_kv_heads=8, head_dim=128, dtype=np.float16)
    with pytest.raises(error, match=message):
        kv.kv_cache_bytes(**{**args, name: value})


def test_every_argument_is_keyword_only():
    with pytest.raises(TypeError):
        kv.kv_cache_bytes(1, 4096, 32, 8, 128, np.float16)


@pytest.mark.parametrize("fields, error", [
    ((-1, 4, 2, 8), ValueError), ((2, 3, 2, 8), ValueError), ((2, 4, 2, 0), ValueError),
    ((2, 4.0, 2, 8), TypeError), ((2, 4, True, 8), TypeError),
])
def test_a_model_shape_is_checked_when_made(fields, error):
    with pytest.raises(error):
        kv.ModelShape(*fields)


def test_the_model_table_is_read_only():
    with pytest.raises(TypeError):
        kv.MODEL_SHAPES["mine"] = kv.ModelShape(1, 1, 1, 1)
    assert sorted(kv.MODEL_SHAPES) == ["Llama-2-70B", "Llama-2-7B", "Llama-3-8B"]
