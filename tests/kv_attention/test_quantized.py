"""QuantizedCache and attend_quantized against the contract, written out independently in tests/references.py.

Hypothesis draws the configuration (bits or float8 format, group size, residual
length, axes), the shapes and the chunking. What the cache holds is compared with
:func:`quantized_reference` to a few ULPs, and held to the per-element bound; decodes
through the cache are compared with attention over the reference's K̂/V̂ at every step (1e-12).
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv

from ..references import heads_problem, naive_attend, problem, quantized_reference

EPS = np.finfo(np.float64).eps
KINDS = [(2, None), (4, None), (8, None), (8, "float8_e4m3fn"), (8, "float8_e5m2")]


@st.composite
def configs(draw, axes=True):
    """Keyword arguments of a QuantizedCache: kind, group size G, residual R >= G, and the axes."""
    nbits, format_name = draw(st.sampled_from(KINDS))
    g = draw(st.integers(1, 5))
    config = dict(nbits=nbits, format=format_name, group_size=g, residual_length=draw(st.integers(g, g + 4)))
    if axes:
        config.update(key_axis=draw(st.sampled_from(kv.quantized.AXES)),
                      value_axis=draw(st.sampled_from(kv.quantized.AXES)))
    return config


def reference(x, config, axis):
    return quantized_reference(x, config["nbits"], config["group_size"], config["residual_length"], axis,
                               config["format"])


def drawn(rng, shape, spread):
    """Normal values times 10**U(-spread, spread) per row, with a repeated value now and then (constant groups)."""
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-spread, spread, shape[:-1] + (1,))
    x[..., ::3, :1] = x[..., :1, :1]
    return x


def filled(config, lead, t_len, d_k=3, d_v=4, seed=0, spread=2):
    rng = np.random.default_rng(seed)
    k, v = drawn(rng, lead + (t_len, d_k), spread), drawn(rng, lead + (t_len, d_v), spread)
    cache = kv.QuantizedCache(lead, d_k, d_v, **config)
    return cache, k, v


def bound(x, scale, format_name):
    """The contract's per-element bound, with 4 ULPs of slack on each term."""
    if format_name is None:
        return scale / 2 * (1 + 4 * EPS) + 4 * EPS * np.abs(x)
    info = ml_dtypes.finfo(getattr(ml_dtypes, format_name))
    return (float(info.eps) / 2 * np.abs(x) + scale * float(info.smallest_subnormal) / 2) * (1 + 4 * EPS)


@settings(max_examples=60, deadline=None)
@given(config=configs(), t_len=st.integers(0, 13), lead=st.sampled_from([(), (2,), (2, 1)]), seed=st.integers(0, 99))
def test_held_values_are_the_contracts_and_within_the_bound(config, t_len, lead, seed):
    cache, k, v = filled(config, lead, t_len, seed=seed)
    k_hat, v_hat = cache.update(k, v)
    for x, x_hat, axis in ((k, k_hat, config["key_axis"]), (v, v_hat, config["value_axis"])):
        expected, scale = reference(x, config, axis)
        np.testing.assert_allclose(x_hat, expected, rtol=4 * EPS, atol=0)
        assert (np.abs(x_hat - x) <= bound(x, scale, config["format"])).all()
    g, r = config["group_size"], config["residual_length"]
    held = g * math.ceil(max(0, t_len - r) / g)
    assert cache.num_quantized == held and cache.get_seq_length() == t_len
    # The residual is held exactly: a copy.
    np.testing.assert_array_equal(k_hat[..., held:, :], k[..., held:, :])
    np.testing.assert_array_equal(v_hat[..., held:, :], v[..., held:, :])


@settings(max_examples=60, deadline=None)
@given(config=configs(), t_len=st.integers(1, 16), data=st.data())
def test_the_state_is_the_same_however_the_tokens_arrived(config, t_len, data):
    whole, k, v = filled(config, (2,), t_len)
    whole.update(k, v)
    cuts = sorted(data.draw(st.sets(st.integers(1, t_len - 1), max_size=t_len)) | {0, t_len}) if t_len > 1 else [0, 1]
    chunked = kv.QuantizedCache((2,), 3, 4, **config)
    for start, stop in zip(cuts, cuts[1:]):
        chunked.update(k[..., start:stop, :], v[..., start:stop, :])
    # The same operations on the same values: equal by construction.
    for a, b in zip(whole.dequantize(), chunked.dequantize()):
        np.testing.assert_array_equal(a, b)
    assert (whole.num_quantized, whole.nbytes) == (chunked.num_quantized, chunked.nbytes)


def nbytes_formula(cache, lead, t_len):
    """The module docstring's formula."""
    q, g, s = cache.num_quantized, cache.group_size, cache.dtype.itemsize
    b = cache.nbits
    total = 0
    for dim, axis in ((cache.k_dim, cache.key_axis), (cache.v_dim, cache.value_axis)):
        scales = q // g * dim if axis == "channel" else q * -(-dim // g)
        total += q * math.ceil(dim * b / 8) + scales * s * (1 if cache.format else 2) + (t_len - q) * dim * s
    return total * math.prod(lead)


@settings(max_examples=40, deadline=None)
@given(config=configs(), t_len=st.integers(0, 20), d_k=st.integers(1, 9), d_v=st.integers(1, 9),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_nbytes_follows_the_formula_with_packed_codes(config, t_len, d_k, d_v, dtype):
    cache = kv.QuantizedCache((3,), d_k, d_v, dtype=dtype, **config)
    rng = np.random.default_rng(1)
    cache.update(rng.standard_normal((3, t_len, d_k)).astype(dtype), rng.standard_normal((3, t_len, d_v)).astype(dtype))
    assert cache.nbytes == nbytes_formula(cache, (3,), t_len)


def test_two_bit_codes_take_a_quarter_byte():
    cache = kv.QuantizedCache((), 8, 8, nbits=2, group_size=4, residual_length=4)
    cache.update(np.arange(64.0).reshape(8, 8), np.arange(64.0).reshape(8, 8))  # 4 positions quantized
    codes = cache._parts[0].codes
    assert codes.dtype == np.uint8 and codes.shape == (4, 2)  # 8 channels of 2 bits: 2 bytes a position
    k_hat, v_hat = cache.dequantize()
    np.testing.assert_array_equal(cache.k_cache, k_hat)  # what a decode checks a given cache against
    np.testing.assert_array_equal(cache.v_cache, v_hat)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_values_and_rounding_are_ml_dtypes_formats(name):
    fmt = getattr(ml_dtypes, name)
    values = kv.quantized.float8_values(name)
    table = np.arange(256, dtype=np.uint8).view(fmt).astype(np.float64)
    np.testing.assert_array_equal(values, table[: len(values)])  # every finite value >= 0, in code order
    assert values[-1] == float(ml_dtypes.finfo(fmt).max) and not np.isfinite(table[len(values)])
    y = np.random.default_rng(0).uniform(-1, 1, 4000) * values[-1] * 2.0 ** -(np.arange(4000) % 40)  # subnormals too
    y = np.concatenate([y, (values[1:] + values[:-1]) / 2])  # every tie between neighbours, too
    np.testing.assert_array_equal(kv.quantized._to_float8(y, values), y.astype(fmt).view(np.uint8))


# Decodes through the cache: attention over the K̂/V̂ the cache held at each step.

def held_after(k, v, config, stop):
    """The reference K̂, V̂ of a cache given positions ``0..stop-1``."""
    return (reference(k[..., :stop, :], config, config["key_axis"])[0],
            reference(v[..., :stop, :], config, config["value_axis"])[0])


def single_head_reference(x, w_q, w_k, w_v, config, chunk_size=1):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    out = np.zeros(x.shape[:-1] + (w_v.shape[1],))
    for start in range(0, x.shape[-2], chunk_size):
        stop = min(start + chunk_size, x.shape[-2])
        k_hat, v_hat = held_after(k, v, config, stop)
        for t in range(start, stop):
            out[..., t : t + 1, :] = naive_attend(q[..., t : t + 1, :], k_hat[..., : t + 1, :], v_hat[..., : t + 1, :])
    return out


@pytest.mark.parametrize("decode", ["cached_attention", "cached_attention_preallocated", "batched_cached_attention"])
@settings(max_examples=15, deadline=None)
@given(config=configs(), t_len=st.integers(1, 12), seed=st.integers(0, 99))
def test_a_decode_through_the_cache_attends_over_what_it_holds(decode, config, t_len, seed):
    x, w_q, w_k, w_v = problem(t_len, batch=2, seed=seed)
    cache = kv.QuantizedCache((2,), 3, 5, **config)
    out = getattr(kv, decode)(x, w_q, w_k, w_v, cache=cache)
    np.testing.assert_allclose(out, single_head_reference(x, w_q, w_k, w_v, config), rtol=0, atol=1e-12)
    assert cache.get_seq_length() == t_len


@settings(max_examples=25, deadline=None)
@given(config=configs(), t_len=st.integers(1, 12), chunk_size=st.integers(1, 5), seed=st.integers(0, 99))
def test_chunked_attention_through_the_cache_attends_over_what_it_holds(config, t_len, chunk_size, seed):
    x, w_q, w_k, w_v = problem(t_len, seed=seed)
    cache = kv.QuantizedCache((), 3, 5, **config)
    out = kv.chunked_attention(x, w_q, w_k, w_v, chunk_size=chunk_size, cache=cache)
    np.testing.assert_allclose(out, single_head_reference(x, w_q, w_k, w_v, config, chunk_size), rtol=0, atol=1e-12)


@pytest.mark.parametrize("path", ["grouped", "repeat_kv"])
@settings(max_examples=15, deadline=None)
@given(config=configs(), t_len=st.integers(1, 10), seed=st.integers(0, 99))
def test_multi_head_decode_through_a_b_h_kv_cache_attends_over_what_it_holds(path, config, t_len, seed):
    n_heads, n_kv_heads, head_dim = 6, 2, 3
    x, w_q, w_k, w_v, w_o = heads_problem(t_len, batch=2, seed=seed)
    cache = kv.QuantizedCache((2, n_kv_heads), head_dim, head_dim, **config)
    out = kv.multi_head_decode(x, w_q, w_k, w_v, w_o, n_heads=n_heads, n_kv_heads=n_kv_heads, path=path, cache=cache)
    by_head = lambda a, n: a.reshape(2, t_len, n, head_dim).swapaxes(1, 2)  # [B, T, n·D] -> [B, n, T, D]
    q, k, v = by_head(x @ w_q, n_heads), by_head(x @ w_k, n_kv_heads), by_head(x @ w_v, n_kv_heads)
    heads = np.zeros((2, n_heads, t_len, head_dim))
    for t in range(t_len):
        k_hat, v_hat = held_after(k, v, config, t + 1)  # [B, H_kv, t+1, D]
        for h in range(n_heads):
            kv_head = h // (n_heads // n_kv_heads)
            heads[:, h, t : t + 1] = naive_attend(q[:, h, t : t + 1], k_hat[:, kv_head], v_hat[:, kv_head])
    expected = heads.swapaxes(1, 2).reshape(2, t_len, n_heads * head_dim) @ w_o
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


# attend_quantized: from the codes, equal to dequantize-then-attend.

@settings(max_examples=60, deadline=None)
@given(config=configs(axes=False), t_len=st.integers(1, 20), n_queries=st.integers(1, 4),
       lead=st.sampled_from([(), (2,), (2, 3)]), d_k=st.integers(1, 7), d_v=st.integers(1, 7), seed=st.integers(0, 99))
def test_attend_quantized_equals_attention_over_the_dequantized_cache(config, t_len, n_queries, lead, d_k, d_v, seed):
    cache, k, v = filled(config, lead, t_len, d_k, d_v, seed=seed, spread=1)
    cache.store(k, v)
    q = np.random.default_rng(seed).standard_normal(lead + (n_queries, d_k))
    expected = naive_attend(q, *cache.dequantize())
    np.testing.assert_allclose(kv.attend_quantized(q, cache), expected, rtol=0, atol=1e-12)


def test_attend_quantized_refuses_what_it_cannot_read():
    cache = kv.QuantizedCache((), 3, 3, group_size=2, residual_length=2)
    with pytest.raises(ValueError, match="empty cache"):
        kv.attend_quantized(np.ones((1, 3)), cache)
    cache.update(np.ones((4, 3)), np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"q \(1, 2\) does not fit the cache: it must be \[C, 3\]"):
        kv.attend_quantized(np.ones((1, 2)), cache)
    with pytest.raises(TypeError, match="q is float32 but the cache holds float64"):
        kv.attend_quantized(np.ones((1, 3), np.float32), cache)
    with pytest.raises(TypeError, match="cache must be a QuantizedCache"):
        kv.attend_quantized(np.ones((1, 3)), kv.DynamicCache())
    with pytest.raises(ValueError, match="q contains NaN or inf"):
        kv.attend_quantized(np.full((1, 3), np.nan), cache)
    assert np.isnan(kv.attend_quantized(np.full((1, 3), np.nan), cache, check_finite=False)).all()  # unscanned
    other = kv.QuantizedCache((), 3, 3, group_size=2, residual_length=2, key_axis="token")
    other.update(np.ones((4, 3)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="keys per channel and values per token"):
        kv.attend_quantized(np.ones((1, 3)), other)


# Crop: a prefix of what was held.

def test_crop_keeps_a_prefix_of_what_was_held():
    config = dict(nbits=2, group_size=2, residual_length=3)
    cache, k, v = filled(dict(config, format=None), (2,), 9)
    k_hat, v_hat = cache.update(k, v)  # positions 0..5 quantized, 6..8 exact
    assert cache.num_quantized == 6
    cache.crop(7)  # into the residual
    np.testing.assert_array_equal(cache.dequantize()[0], k_hat[..., :7, :])
    assert cache.num_quantized == 6
    cache.crop(4)  # whole blocks dropped; the residual goes
    np.testing.assert_array_equal(cache.dequantize()[1], v_hat[..., :4, :])
    assert (cache.num_quantized, cache.get_seq_length()) == (4, 4)
    # Updates go on by the rule; held blocks stay as they were, never re-quantized.
    k_new, _ = cache.update(k[..., 4:9, :], v[..., 4:9, :])
    np.testing.assert_array_equal(k_new[..., :4, :], k_hat[..., :4, :])
    np.testing.assert_allclose(k_new[..., 4:, :], reference(k[..., 4:9, :], dict(config, format=None), "channel")[0],
                               rtol=4 * EPS, atol=0)
    cache.crop(0)
    assert (cache.get_seq_length(), cache.num_quantized, cache.nbytes) == (0, 0, 0)


def test_crop_inside_a_quantized_block_is_refused_and_changes_nothing():
    cache, k, v = filled(dict(nbits=4, format=None, group_size=3, residual_length=3), (), 10)
    cache.update(k, v)  # 0..8 quantized
    before = (cache.dequantize(), cache.nbytes, cache.num_quantized)
    with pytest.raises(ValueError, match=r"crop length 4 cuts a quantized block of group_size=3.*\[9, 10\]"):
        cache.crop(4)
    with pytest.raises(ValueError, match=r"crop length must be in \[0, 10\], got 11"):
        cache.crop(11)
    assert_unchanged(cache, before)


# Bad input: a clear error, and the cache unchanged.

def assert_unchanged(cache, before):
    (k_hat, v_hat), nbytes, held = before
    after_k, after_v = cache.dequantize()
    np.testing.assert_array_equal(after_k, k_hat)
    np.testing.assert_array_equal(after_v, v_hat)
    assert (cache.nbytes, cache.num_quantized) == (nbytes, held)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(nbits=3), ValueError, "nbits must be 2, 4 or 8, got 3"),
    (dict(nbits=4.0), TypeError, "nbits must be an integer"),
    (dict(nbits=4, format="float8_e4m3fn"), ValueError, "format='float8_e4m3fn' takes nbits=8, got nbits=4"),
    (dict(nbits=8, format="float8_e3m4"), ValueError, "unknown format 'float8_e3m4'"),
    (dict(group_size=0), ValueError, "group_size must be >= 1, got 0"),
    (dict(group_size=2.5), TypeError, "group_size must be an integer"),
    (dict(residual_length=0), ValueError, "residual_length must be >= 1, got 0"),
    (dict(group_size=8, residual_length=4), ValueError, "residual_length must be >= group_size, got 4 < 8"),
    (dict(key_axis="head"), ValueError, "unknown key_axis 'head'"),
    (dict(value_axis=None), ValueError, "unknown value_axis None"),
    (dict(dtype=np.float16), TypeError, "dtype must be float32 or float64"),
    (dict(k_dim=0), ValueError, "k_dim must be >= 1, got 0"),
    (dict(v_dim="4"), TypeError, "v_dim must be an integer"),
    (dict(batch_shape=3), TypeError, "batch_shape must be a tuple"),
])
def test_bad_construction_is_refused(kwargs, error, message):
    arguments = dict(dict(batch_shape=(2,), k_dim=3, v_dim=4, group_size=4, residual_length=4), **kwargs)
    with pytest.raises(error, match=message):
        kv.QuantizedCache(**arguments)


def with_value(array, index, value):
    array = array.copy()
    array[index] = value
    return array


@pytest.mark.parametrize("change, error, message", [
    (lambda k, v: (with_value(k, (0, 1, 0), np.nan), v), ValueError, "k contains NaN or inf"),
    (lambda k, v: (k, with_value(v, (1, 0, 2), np.inf)), ValueError, "v contains NaN or inf"),
    (lambda k, v: (k[..., :2], v), ValueError, r"k \(2, 5, 2\) and v \(2, 5, 4\) do not fit the cache: they must "
                                               r"be \[2, T_new, 3\] and \[2, T_new, 4\]"),
    (lambda k, v: (k[:1], v[:1]), ValueError, "do not fit the cache"),
    (lambda k, v: (k[..., :2, :], v), ValueError, "do not fit the cache"),
    (lambda k, v: (k.tolist(), v), TypeError, "k and v must be numpy arrays"),
    (lambda k, v: (k.astype(np.float16), v), TypeError, "k must be a float32 or float64 array"),
    (lambda k, v: (np.where(np.arange(5)[:, None] % 2, 1e308, -1e308) + 0 * k, v), ValueError,  # max - min = 2e308
     r"k holds \|x\| = 1e\+308, beyond max / 4 = 4.49e\+307 of float64"),
    (lambda k, v: (k, with_value(v, (1, 0, 2), np.finfo(np.float64).max)), ValueError,  # code·scale + zero: inf
     r"v holds \|x\| = 1.8e\+308, beyond max / 4"),
    (lambda k, v: (k.astype(np.float32), v), TypeError, "k and v must both be float32 or both float64"),
])
def test_bad_update_is_refused_and_changes_nothing(change, error, message):
    cache, k, v = filled(dict(nbits=4, format=None, group_size=2, residual_length=2), (2,), 5, d_k=3, d_v=4)
    cache.update(k, v)
    before = (cache.dequantize(), cache.nbytes, cache.num_quantized)
    with pytest.raises(error, match=message):
        cache.update(*change(k, v))
    assert_unchanged(cache, before)


def test_check_finite_false_skips_the_scan_and_a_nan_group_is_still_refused():
    cache = kv.QuantizedCache((), 2, 2, group_size=2, residual_length=2)
    k = np.ones((4, 2))
    k[0, 0] = np.nan
    cache.update(k[2:], k[2:])
    cache.update(k[:1], k[:1], check_finite=False)  # held in the residual as given: nothing scanned it
    assert np.isnan(cache.dequantize()[0][2, 0])
    with pytest.raises(ValueError, match="max - min of a group overflows"):
        cache.update(k[1:3], k[1:3], check_finite=False)  # positions 2..3 quantized, the NaN among them


def test_a_float32_cache_refuses_float64_and_holds_float32():
    cache = kv.QuantizedCache((), 3, 3, group_size=2, residual_length=2, dtype=np.float32)
    with pytest.raises(TypeError, match="k is float64, which the cache's float32 cannot hold without loss"):
        cache.update(np.ones((3, 3)), np.ones((3, 3)))
    k = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    k_hat, v_hat = cache.update(k, k)
    assert k_hat.dtype == v_hat.dtype == np.float32
    expected, scale = reference(k, dict(nbits=4, group_size=2, residual_length=2, format=None), "channel")
    np.testing.assert_allclose(k_hat, expected, rtol=0, atol=8 * np.finfo(np.float32).eps * np.abs(k).max())


def test_a_decode_refuses_a_cache_that_does_not_fit_and_leaves_it_unchanged():
    x, w_q, w_k, w_v = problem(6, batch=2)
    cache = kv.QuantizedCache((2,), 3, 5, group_size=2, residual_length=2)
    kv.cached_attention(x, w_q, w_k, w_v, cache=cache)
    before = (cache.dequantize(), cache.nbytes, cache.num_quantized)
    with pytest.raises(ValueError, match="cache does not fit x"):
        kv.cached_attention(x[..., :4], w_q[:4], w_k[:4], w_v[:4, :4], cache=cache)
    with pytest.raises(TypeError, match="cache holds float64 but the computation is float32"):
        kv.cached_attention(*(a.astype(np.float32) for a in (x, w_q, w_k, w_v)), cache=cache)
    assert_unchanged(cache, before)


def test_unchecked_values_whose_group_range_overflows_are_still_refused_when_quantized():
    cache, k, v = filled(dict(nbits=4, format=None, group_size=2, residual_length=2), (2,), 5, d_k=3, d_v=4)
    cache.update(k, v)
    before = (cache.dequantize(), cache.nbytes, cache.num_quantized)
    huge = np.where(np.arange(5)[:, None] % 2, 1e308, -1e308) + 0 * k  # max - min = 2e308
    with pytest.raises(ValueError, match="too large to quantize in float64"):
        cache.update(huge, v, check_finite=False)
    assert_unchanged(cache, before)


@pytest.mark.parametrize("q_shape, batch_shape", [((0, 4), ()), ((0, 3, 4), (0,)), ((2, 0, 4), (2,))])
def test_attention_from_the_codes_of_zero_queries_or_sequences_is_empty(q_shape, batch_shape):
    cache = kv.QuantizedCache(batch_shape, 4, 5, group_size=2, residual_length=2)
    cache.update(np.ones(batch_shape + (5, 4)), np.ones(batch_shape + (5, 5)))
    out = kv.attend_quantized(np.ones(q_shape), cache)
    assert out.shape == q_shape[:-1] + (5,) and out.dtype == np.float64


@pytest.mark.parametrize("nbits, error", [(True, TypeError), (2.0, TypeError), (-4, ValueError), (16, ValueError)])
def test_nbits_is_an_integer_of_2_4_or_8(nbits, error):
    with pytest.raises(error, match="nbits must be"):
        kv.QuantizedCache((), 4, 4, nbits=nbits)
    assert kv.QuantizedCache((), 4, 4, nbits=np.int8(4)).nbits == 4
