"""DynamicCache and StaticCache: update(), get_seq_length(), crop(), nbytes and their errors.

A cache copies keys and values in and out, never computes them: they are compared bit for bit.
"""

import numpy as np
import pytest

import kv_attention as kv



def positions(t_new, lead=(), d=3, start=0.0):
    """[*lead, t_new, d] of distinct values, so a misplaced position shows."""
    size = int(np.prod(lead, dtype=int)) * t_new * d
    return (start + np.arange(size, dtype=np.float64)).reshape(lead + (t_new, d))


CACHES = {
    "dynamic": lambda lead=(): kv.DynamicCache(),
    "static": lambda lead=(): kv.StaticCache(lead, 6, 3, 2),
}


@pytest.fixture(params=sorted(CACHES))
def make_cache(request):
    return CACHES[request.param]


@pytest.mark.parametrize("lead", [(), (2,), (2, 4)])  # [T, D], [B, T, D], [B, H_kv, T, D]
def test_update_returns_everything_so_far(make_cache, lead):
    cache = make_cache(lead)
    k1, v1 = positions(2, lead), positions(2, lead, d=2, start=100)
    k2, v2 = positions(3, lead, start=50), positions(3, lead, d=2, start=200)
    cache.update(k1, v1)
    k, v = cache.update(k2, v2)
    np.testing.assert_array_equal(k, np.concatenate([k1, k2], axis=-2))
    np.testing.assert_array_equal(v, np.concatenate([v1, v2], axis=-2))
    assert cache.get_seq_length() == 5


def test_empty_cache_has_length_and_size_zero(make_cache):
    cache = make_cache()
    assert cache.get_seq_length() == 0
    assert cache.nbytes == 0


def test_nbytes_is_the_logical_size_of_one_sequence():
    # The lab's formula: 2 x T x 64 x 8 bytes for one float64 sequence with D_k = D_v = 64.
    for cache in (kv.DynamicCache(), kv.StaticCache((), 256, 64, 64)):
        for _ in range(10):
            cache.update(np.ones((1, 64)), np.ones((1, 64)))
        assert cache.nbytes == 2 * 10 * 64 * 8


def test_static_cache_refuses_to_write_past_max_seq_len():
    cache = kv.StaticCache((), 4, 3, 2)
    cache.update(positions(3), positions(3, d=2))
    k_before, v_before = cache.k_cache.copy(), cache.v_cache.copy()
    with pytest.raises(ValueError, match="max_seq_len=4"):
        cache.update(positions(2), positions(2, d=2))
    assert cache.get_seq_length() == 3
    np.testing.assert_array_equal(cache.k_cache, k_before)
    np.testing.assert_array_equal(cache.v_cache, v_before)


@pytest.mark.parametrize(
    "k_shape, v_shape",
    [((2, 4), (2, 2)), ((2, 3), (3, 2)), ((3,), (2,)), ((1, 2, 3), (1, 2, 2))],
)
def test_update_with_shapes_that_do_not_fit_raises_and_changes_nothing(make_cache, k_shape, v_shape):
    cache = make_cache()
    cache.update(positions(1), positions(1, d=2))
    with pytest.raises(ValueError, match=r"k \("):
        cache.update(np.zeros(k_shape), np.zeros(v_shape))
    assert cache.get_seq_length() == 1


@pytest.mark.parametrize(
    "cache",
    [kv.StaticCache((), 4, 3, 2, dtype=np.float32), kv.DynamicCache()],
    ids=["static", "dynamic"],
)
def test_update_refuses_a_lossy_dtype(cache):
    if cache.get_seq_length() == 0 and cache.k_cache is None:  # a DynamicCache takes its dtype from the first update
        cache.update(positions(1).astype(np.float32), positions(1, d=2).astype(np.float32))
    length = cache.get_seq_length()
    with pytest.raises(TypeError, match="float64.*float32"):
        cache.update(np.zeros((1, 3)), np.zeros((1, 2)))
    assert cache.get_seq_length() == length


@pytest.mark.parametrize("dtype", [np.int64, np.float16, np.bool_])
def test_update_refuses_non_float_keys_and_values(make_cache, dtype):
    cache = make_cache()
    with pytest.raises(TypeError, match="must both be float32 or both float64"):
        cache.update(np.ones((1, 3), dtype), np.ones((1, 2), dtype))
    assert cache.get_seq_length() == 0


def test_update_refuses_keys_and_values_of_different_dtypes(make_cache):
    with pytest.raises(TypeError, match="float32 and float64"):
        make_cache().update(np.ones((1, 3), np.float32), np.ones((1, 2)))


def test_crop_to_zero_empties_a_dynamic_cache_as_new():
    cache = kv.DynamicCache()
    cache.update(np.ones((2, 3), np.float32), np.ones((2, 2), np.float32))
    cache.crop(0)
    assert cache.k_cache is None and cache.get_seq_length() == 0
    cache.update(np.ones((4, 1, 5)), np.ones((4, 1, 2)))  # another dtype and leading axes
    assert cache.k_cache.shape == (4, 1, 5)


def test_update_refuses_non_arrays(make_cache):
    with pytest.raises(TypeError, match="numpy arrays"):
        make_cache().update([[1.0, 2.0, 3.0]], [[1.0, 2.0]])


def test_crop_drops_later_positions(make_cache):
    cache = make_cache()
    k, v = positions(5), positions(5, d=2)
    cache.update(k, v)
    cache.crop(2)
    assert cache.get_seq_length() == 2
    k_after, v_after = cache.update(positions(1, start=-9), positions(1, d=2, start=-9))
    np.testing.assert_array_equal(k_after[:2], k[:2])
    np.testing.assert_array_equal(k_after[2], positions(1, start=-9)[0])
    with pytest.raises(ValueError, match=r"crop length must be in \[0, 3\]"):
        cache.crop(4)
    for bad in (1.5, None, True):
        with pytest.raises(TypeError, match="crop length must be an integer"):
            cache.crop(bad)
    assert cache.get_seq_length() == 3


def test_static_cache_checks_its_sizes_and_dtype():
    with pytest.raises(ValueError, match="max_seq_len must be >= 0, got -1"):
        kv.StaticCache((), -1, 3, 2)
    with pytest.raises(TypeError, match="k_dim must be an integer, got 3.5"):
        kv.StaticCache((), 4, 3.5, 2)
    with pytest.raises(TypeError, match="batch_shape must be a tuple"):
        kv.StaticCache(2, 4, 3, 2)
    with pytest.raises(TypeError, match=r"batch_shape\[0\] must be an integer"):
        kv.StaticCache((2.9,), 4, 3, 2)
    with pytest.raises(TypeError, match="float32, float64, bfloat16 or float16"):
        kv.StaticCache((), 4, 3, 2, dtype=np.int64)
    cache = kv.StaticCache((2, 3), 7, 4, 5, dtype=np.float32)
    assert cache.k_cache.shape == (2, 3, 7, 4) and cache.v_cache.shape == (2, 3, 7, 5)
    assert cache.k_cache.dtype == np.float32 and cache.max_seq_len == 7


def test_reprs_are_short_and_say_the_layout_and_the_length():
    dynamic = kv.DynamicCache()
    assert repr(dynamic) == "DynamicCache(seq_length=0)"
    dynamic.update(positions(4, (2,)), positions(4, (2,), d=2))
    assert repr(dynamic) == "DynamicCache(k_cache=[2, 4, 3], v_cache=[2, 4, 2], dtype=float64, seq_length=4)"
    static = kv.StaticCache((2, 8), 4096, 128, 64, np.float32)
    static.update(np.ones((2, 8, 3, 128), np.float32), np.ones((2, 8, 3, 64), np.float32))
    assert repr(static) == (
        "StaticCache(batch_shape=(2, 8), max_seq_len=4096, k_dim=128, v_dim=64, dtype=float32, seq_length=3)"
    )
    assert repr(kv.StaticCache((), 5, 3, 2)) == ("StaticCache(batch_shape=(), max_seq_len=5, k_dim=3, v_dim=2, "
                                                 "dtype=None, seq_length=0)")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("which", ["k", "v"])
def test_update_refuses_nan_or_inf_and_changes_nothing(make_cache, bad, which):
    cache = make_cache()
    cache.update(positions(1), positions(1, d=2))
    k, v = positions(2, start=10), positions(2, d=2, start=20)
    (k if which == "k" else v)[1, 0] = bad
    with pytest.raises(ValueError, match=rf"^{which} contains NaN or inf$"):
        cache.update(k, v)
    assert cache.get_seq_length() == 1
    np.testing.assert_array_equal(cache.k_cache[..., :1, :], positions(1))


def test_update_refuses_a_masked_array(make_cache):
    cache = make_cache()
    k = np.ma.array(positions(2), mask=[[False] * 3, [True] * 3])  # the mask would be dropped silently
    with pytest.raises(TypeError, match=r"k is a masked array; pass a plain ndarray"):
        cache.update(k, positions(2, d=2))
    assert cache.get_seq_length() == 0


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_update_takes_a_big_endian_array_or_a_matrix_as_a_plain_native_array(make_cache):
    # As every other entry point (as_float_array): '>f8' is float64 converted, np.matrix a plain array.
    cache = make_cache()
    k, v = cache.update(positions(2).astype(">f8"), np.matrix(positions(2, d=2)))
    np.testing.assert_array_equal(k, positions(2))
    np.testing.assert_array_equal(v, positions(2, d=2))
    assert type(k) is type(v) is np.ndarray and k.dtype == v.dtype == np.float64 and k.dtype.isnative
    k, v = cache.update(positions(1, start=7).astype(">f8"), positions(1, d=2, start=9).astype(">f8"))
    np.testing.assert_array_equal(k, np.concatenate([positions(2), positions(1, start=7)]))
    with pytest.raises(TypeError, match=r"must both be float32 or both float64, got >f4 and float64"):
        cache.update(positions(1).astype(">f4"), positions(1, d=2))


# --- a cache built without a dtype takes its first update's: the model's (HF 5's StaticLayer.lazy_initialization) ---

LLAMA = kv.ModelConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2)  # head_dim 4
BUILT = {
    "static": lambda dtype: kv.StaticCache((1, 2), 12, 4, 4, dtype),
    "window": lambda dtype: kv.SlidingWindowCache((1, 2), 4, 4, 4, n_sink=1, dtype=dtype),
    "quantized": lambda dtype: kv.QuantizedCache((1, 2), 4, 4, group_size=2, residual_length=2, dtype=dtype),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", BUILT)
def test_a_cache_built_without_a_dtype_holds_the_models_and_gives_its_logits_exactly(kind, dtype):
    weights = kv.init_weights(LLAMA, seed=1, dtype=dtype)
    ids = np.random.default_rng(2).integers(0, 50, (1, 9))
    built, typed = BUILT[kind](None), BUILT[kind](dtype)
    assert built.k_cache is None and built.nbytes == 0 and "dtype=None" in repr(built)
    assert built.nbytes_reserved == (None if kind == "quantized" else 0)  # nothing allocated yet
    for chunk in (ids[:, :6], ids[:, 6:7], ids[:, 7:]):  # a prefill, a decode step, a chunk of 2
        logits = kv.forward(LLAMA, weights, chunk, cache=built)
        assert logits.dtype == dtype
        np.testing.assert_array_equal(logits, kv.forward(LLAMA, weights, chunk, cache=typed))
    assert [c.layout[3] for c in built.layers] == [np.dtype(dtype)] * 2 and f"dtype={np.dtype(dtype)}" in repr(built)
    assert (built.nbytes, built.nbytes_reserved) == (typed.nbytes, typed.nbytes_reserved)


@pytest.mark.parametrize("kind", BUILT)
def test_a_failed_first_call_leaves_a_cache_without_a_dtype_as_built(kind):
    name = "model.layers.0.mlp.up_proj.weight"  # a NaN here makes layer 1's k NaN: layer 0 was written already
    weights = kv.init_weights(LLAMA, seed=1, dtype=np.float32)
    weights[name] = weights[name].copy()
    weights[name][0, 0] = np.nan
    built = BUILT[kind](None)
    with pytest.raises(ValueError, match="NaN or inf"):
        kv.forward(LLAMA, weights, [[1, 2, 3]], cache=built)
    assert built.layers == [built] and built.k_cache is None and built.get_seq_length() == 0
    k, v = np.zeros((1, 2, 1, 4), np.float64), np.zeros((1, 2, 1, 4), np.float64)
    with pytest.raises(ValueError, match="do not fit the cache"):
        built.update(k[..., :3], v)  # refused before it allocates
    assert built.k_cache is None
    built.update(k, v)  # then free to take float64
    assert built.layout[3] == np.float64 and built.get_seq_length() == 1


def test_an_explicit_dtype_is_kept_and_refuses_what_it_cannot_hold():
    for cache in (kv.StaticCache((), 4, 3, 2, np.float32), kv.SlidingWindowCache((), 4, 3, 2, dtype=np.float32)):
        assert cache.k_cache.dtype == np.float32 and cache.nbytes_reserved == 4 * (3 + 2) * 4  # 4 slots, allocated
        with pytest.raises(TypeError, match="float64, which the cache's float32 cannot hold"):
            cache.update(positions(1), positions(1, d=2))


# --- the Cache base class ---------------------------------------------------------------------------


def user_problem(t_len, rng_seed=3):
    rng = np.random.default_rng(rng_seed)
    return rng.standard_normal((t_len, 4)), *(rng.standard_normal((4, d)) / 2 for d in (3, 3, 5))


class MinimalCache(kv.Cache):
    """A Cache subclass of the three abstract methods only: the base class supplies the rest."""

    def __init__(self):
        self.inner = kv.DynamicCache()

    def update(self, k, v):
        return self.inner.update(k, v)

    def get_seq_length(self):
        return self.inner.get_seq_length()

    def crop(self, length):
        self.inner.crop(length)


def test_a_decode_refuses_an_object_that_is_not_a_cache_and_uses_a_subclass_of_three_methods():
    class NotACache:
        update = get_seq_length = crop = None

    with pytest.raises(TypeError, match="^cache must be a kv_attention.Cache instance"):
        kv.cached_attention(*user_problem(3), cache=NotACache())
    cache = MinimalCache()
    out = kv.cached_attention(*user_problem(3), cache=cache)
    np.testing.assert_allclose(out, kv.causal_attention(*user_problem(3)), rtol=1e-12, atol=1e-12)
    assert cache.get_seq_length() == 3


def test_the_base_class_gives_a_full_cache_s_defaults():
    cache = MinimalCache()
    assert (cache.k_cache, cache.v_cache, cache.max_seq_len, cache.window, cache.n_sink) == (None, None, None, None, 0)
    cache.update(np.ones((3, 2)), np.ones((3, 1)))
    np.testing.assert_array_equal(cache.key_positions(2), [0, 1, 2, 3, 4])
    with pytest.raises(TypeError, match="Can't instantiate abstract class"):
        kv.Cache()


def test_the_library_s_caches_subclass_the_base_class():
    for cache in (kv.DynamicCache(), kv.StaticCache((), 2, 1, 1), kv.SlidingWindowCache((), 2, 1, 1)):
        assert isinstance(cache, kv.Cache)
    assert kv.StaticCache((), 2, 1, 1).max_seq_len == 2 and kv.DynamicCache().max_seq_len is None
    assert kv.SlidingWindowCache((), 3, 1, 1, n_sink=2).window == 3 and kv.DynamicCache().window is None


def test_a_full_static_cache_and_a_full_pool_share_cache_full_error():
    static = kv.StaticCache((), 2, 3, 2)
    with pytest.raises(kv.CacheFullError, match="cache is full: 0 of max_seq_len=2") as full:
        static.update(positions(3), positions(3, d=2))
    assert isinstance(full.value, ValueError) and isinstance(full.value, kv.StaticCacheFullError)
    pool = kv.PagedKVCache(1, 2, 3, 2)
    pool.add_sequence("a")
    with pytest.raises(kv.CacheFullError, match="out of blocks") as out:
        pool.update(["a"], positions(3, (1,)), positions(3, (1,), d=2))
    assert isinstance(out.value, RuntimeError) and isinstance(out.value, kv.OutOfBlocksError)
    assert static.get_seq_length() == 0 and pool.get_seq_length("a") == 0


def test_a_decode_into_a_static_cache_without_room_raises_cache_full_error():
    args, cache = user_problem(3), kv.StaticCache((), 2, 3, 5)
    with pytest.raises(kv.StaticCacheFullError, match="cache too short: 0 of max_seq_len=2"):
        kv.cached_attention_preallocated(*args, cache=cache)


@pytest.mark.parametrize("make", sorted(CACHES) + ["window"])
def test_update_without_the_finite_scan_still_checks_types_and_shapes(make):
    cache = kv.SlidingWindowCache((), 4, 3, 2) if make == "window" else CACHES[make]()
    cache.update(positions(1), positions(1, d=2), check_finite=False)
    with pytest.raises(ValueError, match=r"do not fit the cache's"):
        cache.update(positions(1, d=4), positions(1, d=2), check_finite=False)
    with pytest.raises(TypeError, match="^k and v must both be float32 or both float64, got float32 and float64$"):
        cache.update(positions(1).astype(np.float32), positions(1, d=2), check_finite=False)
    with pytest.raises(ValueError, match="k contains NaN or inf"):
        cache.update(np.full((1, 3), np.nan), positions(1, d=2))  # the default scans
    assert cache.get_seq_length() == 1




# --- one object for every layer (Hugging Face 5's Cache of layers) ------------------------------------------------


@pytest.mark.parametrize("make", [lambda: kv.DynamicCache(), lambda: kv.StaticCache((2,), 6, 3, 3),
                                  lambda: kv.SlidingWindowCache((2,), 4, 3, 3, n_sink=1),
                                  lambda: kv.QuantizedCache((2,), 3, 3, group_size=2, residual_length=2), MinimalCache])
def test_update_of_a_layer_not_seen_makes_it_as_the_cache_was_made_and_crop_cuts_every_layer(make):
    cache = make()
    k0, k2 = positions(5, (2,)), positions(5, (2,), start=100.0)
    cache.update(k0, k0)
    if isinstance(cache, MinimalCache):
        cache.layer(2).update(k2, k2)
    else:
        cache.update(k2, k2, 2)  # HF's update(key_states, value_states, layer_idx)
    assert len(cache.layers) == 3 and type(cache.layer(1)) is type(cache) and cache.layer(0) is cache
    assert [c.get_seq_length() for c in cache.layers] == [5, 0, 5]
    if not isinstance(cache, MinimalCache):
        assert cache.get_seq_length(2) == 5 and cache.get_seq_length() == 5  # layer_idx defaults to 0
        np.testing.assert_allclose(cache.layer(2).update(k2[..., :0, :], k2[..., :0, :])[0][..., -1, :], k2[..., -1, :],
                                   rtol=0, atol=0.1 * isinstance(cache, kv.QuantizedCache))
        assert cache.nbytes == 2 * cache.layer(2).nbytes  # layer 1 holds nothing
    if cache.can_crop and not isinstance(cache, MinimalCache):  # a subclass's own crop is of its own layer
        cache.update(k0, k0, 1)
        cache.crop(4)
        assert [c.get_seq_length() for c in cache.layers] == [4, 4, 4]


def test_static_crop_touches_only_the_positions_it_drops():
    cache = kv.StaticCache((), 8, 3, 3)
    cache.update(positions(6), positions(6))
    cache.k_cache[7] = cache.v_cache[7] = -1.0  # past the length: a crop that zeroed to max_seq_len would clear it
    cache.crop(4)
    np.testing.assert_array_equal(cache.k_cache[:6], np.concatenate([positions(4), np.zeros((2, 3))]))
    assert (cache.k_cache[7] == -1).all() and (cache.v_cache[7] == -1).all() and not cache.k_cache[6].any()
