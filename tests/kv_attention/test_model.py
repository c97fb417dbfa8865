"""The Llama model: forward against the naive reference, every cache against the full forward, checkpoints, serve.

Tolerances: 1e-9 (absolute, logits of order one) in float64 between the model and
``naive_llama_forward``, and between a cached decode and the full forward.
"""

import dataclasses
import json

import numpy as np
import pytest

import kv_attention as kv

from ..references import attends, naive_attend, naive_llama_forward, quantized_reference

TOL = {"rtol": 0, "atol": 1e-9}
CONFIG = kv.ModelConfig(vocab_size=61, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                        num_attention_heads=6, num_key_value_heads=2, head_dim=6, rope_theta=100.0)


def weights(config=CONFIG, seed=0, dtype=np.float64):
    """init_weights with norm weights drawn too, so that a norm that ignored its weight would fail."""
    w = kv.init_weights(config, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    for name in w:
        if name.endswith("norm.weight"):
            w[name] = (1.0 + 0.3 * rng.standard_normal(w[name].shape)).astype(dtype)
    return w


def tokens(shape, seed=1, config=CONFIG):
    return np.random.default_rng(seed).integers(0, config.vocab_size, shape)


def caches(kind, batch=2, config=CONFIG, max_seq_len=32, window=None):
    """One new cache of ``kind`` for every layer, batch shape (B, H_kv)."""
    shape, d = (batch, config.num_key_value_heads), config.head_dim
    make = {
        "dynamic": lambda: kv.DynamicCache(),
        "static": lambda: kv.StaticCache(shape, max_seq_len, d, d, np.float64),
        "window": lambda: kv.SlidingWindowCache(shape, window or max_seq_len, d, d),
        "quantized": lambda: kv.QuantizedCache(shape, d, d, nbits=4, group_size=2, residual_length=4),
    }[kind]
    return make()


def paged_views(batch=2, config=CONFIG, num_blocks=64, block_size=4, **options):
    """One view of a paged cache of every layer: one block table per sequence serves them all."""
    d, h_kv = config.head_dim, config.num_key_value_heads
    pool = kv.PagedKVCache(num_blocks, block_size, d, d, num_kv_heads=h_kv, num_layers=config.num_hidden_layers,
                           **options)
    for i in range(batch):
        pool.add_sequence(i)
    return kv.PagedCacheView(pool, list(range(batch)))


def cached_logits(cache, ids, chunks):
    """forward over ``ids [B, T]`` in chunks of the given sizes through ``cache``: ``[B, T, V]``."""
    out, start = [], 0
    for size in chunks:
        out.append(kv.forward(CONFIG, W64, ids[:, start : start + size], cache=cache))
        start += size
    assert start == ids.shape[1]
    return np.concatenate(out, axis=1)


W64 = weights()
IDS = tokens((2, 11))
FULL = kv.forward(CONFIG, W64, IDS)
KINDS = ("dynamic", "static", "window", "paged")
CHUNKS = {"token by token": [1] * 11, "prefill then decode": [5] + [1] * 6, "chunks": [3, 4, 1, 3]}


def make_cache(kind):
    return paged_views() if kind == "paged" else caches(kind)


def round_trip(k, v):
    """A layer's K/V ``[H_kv, T, D]`` as ``caches("quantized")`` holds them: keys by channel, values by token."""
    return quantized_reference(k, 4, 2, 4, "channel")[0], quantized_reference(v, 4, 2, 4, "token")[0]


@pytest.mark.parametrize("tie", [False, True])
def test_forward_equals_the_naive_reference(tie):
    config = kv.ModelConfig(**{**CONFIG.__dict__, "tie_word_embeddings": tie})
    w = weights(config, seed=3)
    ids = tokens((2, 7), seed=3)
    np.testing.assert_allclose(kv.forward(config, w, ids), naive_llama_forward(config, w, ids), **TOL)
    assert ("lm_head.weight" in w) is not tie


def test_head_dim_defaults_to_hidden_size_over_heads_and_mha_works():
    config = kv.ModelConfig(vocab_size=17, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2)
    assert config.head_dim == 4
    w, ids = weights(config, seed=5), tokens((1, 6), seed=5, config=config)
    np.testing.assert_allclose(kv.forward(config, w, ids), naive_llama_forward(config, w, ids), **TOL)


@pytest.mark.parametrize("chunks", list(CHUNKS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_cached_decode_equals_the_full_forward_at_every_position(kind, chunks):
    np.testing.assert_allclose(cached_logits(make_cache(kind), IDS, CHUNKS[chunks]), FULL, **TOL)


@pytest.mark.parametrize("chunks", [[1] * 11, [4, 1, 1, 5]])
def test_a_window_cache_beyond_its_window_is_huggingfaces_sliding_window(chunks):
    # window 4 < 11 positions: query t attends keys t - 4 < s <= t, rotated at their absolute positions
    expected = naive_llama_forward(CONFIG, W64, IDS, window=4)
    np.testing.assert_allclose(cached_logits(caches("window", window=4), IDS, chunks), expected, **TOL)
    assert not np.allclose(expected, FULL, atol=1e-3)  # the window does cut keys off


def test_a_quantized_cache_decodes_over_its_own_dequantized_keys_and_values():
    # At step t the cache holds positions 0..t, the oldest quantized (channel groups for keys, token groups for
    # values); the last position's logits are the reference's over those K̂, V̂.
    cache = caches("quantized")
    for t in range(IDS.shape[1]):
        got = kv.forward(CONFIG, W64, IDS[:, t : t + 1], cache=cache)[:, 0]
        expected = naive_llama_forward(CONFIG, W64, IDS[:, : t + 1], kv_hook=round_trip)[:, -1]
        np.testing.assert_allclose(got, expected, **TOL)
    assert cache.num_quantized == 8 and len(cache.layers) == 2  # 2·ceil((11 - 4) / 2): the test reached quantized keys


@pytest.mark.parametrize("kind", KINDS + ("quantized",))
def test_generate_gives_the_same_tokens_with_every_cache(kind):
    prompt = IDS[:, :4]
    expected = kv.generate(CONFIG, W64, prompt, 7, use_cache=False)
    assert expected.shape == (2, 11) and expected.dtype == np.int64 and (expected[:, :4] == prompt).all()
    np.testing.assert_array_equal(kv.generate(CONFIG, W64, prompt, 7), expected)  # a DynamicCache by default, HF's
    # each step recomputing the prefix: generate is argmax of the full forward, fed back
    assert (expected[:, 4:] == kv.forward(CONFIG, W64, expected[:, :-1])[:, 3:].argmax(-1)).all()
    if kind == "quantized":  # greedy over the reference's logits with each layer's K/V as the cache holds them
        expected = prompt
        for _ in range(7):
            logits = naive_llama_forward(CONFIG, W64, expected, kv_hook=round_trip)[:, -1]
            expected = np.concatenate([expected, logits.argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(kv.generate(CONFIG, W64, prompt, 7, cache=make_cache(kind)), expected)


@pytest.mark.parametrize("kind", ["static", "paged"])
def test_generate_refuses_a_cache_too_short_for_every_step_before_the_first(kind):
    # 4 prompt tokens and 7 new ones write 4 + 7 - 1 = 10 positions: a StaticCache of 9 (a pool of 4 blocks of 2
    # for 2 sequences) is too short, refused before the prefill; one of 10 (5 blocks each) is enough
    small, enough = {"static": (caches("static", max_seq_len=9), caches("static", max_seq_len=10)),
                     "paged": (paged_views(num_blocks=9, block_size=2), paged_views(num_blocks=10, block_size=2))}[kind]
    error = kv.StaticCacheFullError if kind == "static" else kv.OutOfBlocksError
    with pytest.raises(error, match="writes 10 more" if kind == "static" else "out of blocks"):
        kv.generate(CONFIG, W64, IDS[:, :4], 7, cache=small)
    assert lengths(small) == lengths(paged_views() if kind == "paged" else caches(kind))  # nothing written
    np.testing.assert_array_equal(kv.generate(CONFIG, W64, IDS[:, :4], 7, cache=enough),
                                  kv.generate(CONFIG, W64, IDS[:, :4], 7))
    assert lengths(enough) == [str(np.array([10, 10]) if kind == "paged" else 10)] * 2

def test_float32_and_bfloat16_weights_compute_in_float32():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    w32 = {k: v.astype(np.float32) for k, v in W64.items()}
    out = kv.forward(CONFIG, w32, IDS, cache=caches("dynamic"))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, FULL, rtol=0, atol=1e-4)  # float32 rounding of logits of order one
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in W64.items()}
    assert kv.forward(CONFIG, bf16, IDS).dtype == np.float32


def test_16bit_weights_are_converted_once_and_kept_while_they_live():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in W64.items()}
    as_f32 = {k: v.astype(np.float32) for k, v in bf16.items()}  # the same values, converted by hand
    expected = kv.forward(CONFIG, as_f32, IDS)
    head = bf16["lm_head.weight"]
    np.testing.assert_array_equal(kv.forward(CONFIG, bf16, IDS), expected)
    assert not head.flags.writeable  # its float32 copy is kept: a write into it would leave the copy stale
    copy = kv.model.converted(head, np.dtype(np.float32))
    assert copy.dtype == np.float32 and copy is kv.model.converted(head, np.dtype(np.float32))  # the same copy
    np.testing.assert_array_equal(kv.forward(CONFIG, bf16, IDS), expected)  # the second call reads the copies
    count = len(kv.model._CONVERTED)
    del bf16, head, copy
    assert len(kv.model._CONVERTED) == count - (len(W64) - 1)  # freed with the weights (all but the embedding)
    per_call = {k: v.astype(np.float16) for k, v in W64.items()}
    out = kv.forward(CONFIG, per_call, IDS, convert_once=False)  # the explicit choice: only 16-bit weights held
    np.testing.assert_array_equal(out, kv.forward(CONFIG, {k: v.astype(np.float32) for k, v in per_call.items()}, IDS))
    assert all(w.flags.writeable for w in per_call.values()) and len(kv.model._CONVERTED) == count - (len(W64) - 1)


def test_a_checkpoint_in_huggingfaces_format_loads_and_runs(tmp_path):
    from safetensors.numpy import save_file

    w = weights(seed=7)
    save_file(w, str(tmp_path / "model.safetensors"))
    hf_config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 61, "hidden_size": 24,
                 "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
                 "head_dim": 6, "rope_theta": 100.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                 "hidden_act": "silu", "max_position_embeddings": 2048, "rope_scaling": None, "attention_bias": False,
                 "torch_dtype": "float64", "bos_token_id": 1, "eos_token_id": 2}
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    config = kv.ModelConfig.from_json(tmp_path / "config.json")
    assert config == dataclasses.replace(CONFIG, bos_token_id=1, eos_token_id=2)
    loaded = kv.load_weights(str(tmp_path / "model.safetensors"))
    assert loaded.keys() == w.keys()
    np.testing.assert_allclose(kv.forward(config, loaded, IDS), naive_llama_forward(config, w, IDS), **TOL)
    np.testing.assert_array_equal(kv.generate(config, loaded, IDS[:, :3], 4, cache=caches("dynamic")),
                                  kv.generate(config, w, IDS[:, :3], 4))


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mistral"}, "not a Llama model"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "not a Llama model"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_from_json_refuses_what_it_does_not_compute(tmp_path, change, message):
    raw = {"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, **change}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message):
        kv.ModelConfig.from_json(tmp_path / "config.json")


@pytest.mark.parametrize("text, error, message", [
    ("[1, 2]", ValueError, r"not a Llama model's config.json \(a JSON object .*got \[1, 2\]"),
    ('{"model_type": "llama", "rope_parameters": [1]}', ValueError, "rope_parameters must be a JSON object"),
])
def test_from_json_refuses_a_file_that_is_not_a_config(tmp_path, text, error, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(error, match=message):
        kv.ModelConfig.from_json(tmp_path / "config.json")
    with pytest.raises(TypeError, match="path must be a path"):
        kv.ModelConfig.from_json(5)  # not file descriptor 5


def test_from_json_defaults_num_key_value_heads_to_num_attention_heads_as_llamaconfig(tmp_path):
    raw = {"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
           "num_attention_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert kv.ModelConfig.from_json(tmp_path / "config.json").num_key_value_heads == 2


@pytest.mark.parametrize("field, value, error", [
    ("rope_theta", 0, ValueError), ("rope_theta", -1.0, ValueError), ("rope_theta", float("nan"), ValueError),
    ("rope_theta", float("inf"), ValueError), ("rope_theta", "abc", TypeError), ("rope_theta", True, TypeError),
    ("rms_norm_eps", -1e-6, ValueError), ("rms_norm_eps", None, TypeError), ("rms_norm_eps", "x", TypeError),
    ("tie_word_embeddings", "no", TypeError), ("tie_word_embeddings", 0, TypeError),
])
def test_a_bad_config_field_is_named(field, value, error):
    with pytest.raises(error, match=field):
        kv.ModelConfig(**{**CONFIG.__dict__, field: value})
    assert kv.ModelConfig(**{**CONFIG.__dict__, "rms_norm_eps": 0, "rope_theta": np.float32(1e4)}).rms_norm_eps == 0


def layers(cache):
    """The caches of each layer (None: not made yet); a paged view for every layer."""
    if isinstance(cache, kv.PagedCacheView):
        return [cache] * cache.cache.num_layers
    return cache.layers + [None] * (CONFIG.num_hidden_layers - len(cache.layers))


def lengths(cache):
    """Each layer's length (0 for a layer not made yet); a paged view's is every layer's."""
    return [str(0 if c is None else c.get_seq_length()) for c in layers(cache)]


@pytest.mark.parametrize("ids, message", [
    (np.array([[1, 61]]), r"input_ids must be \[B, T\] of ids in \[0, vocab_size=61\), .* ids up to 61"),
    (np.array([[1, -1]]), r"input_ids\[0, 1\] = -1 is negative"),
    (np.array([1, 2]), r"input_ids must be \[B, T\]"),
])
def test_token_ids_outside_the_vocabulary_are_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        kv.forward(CONFIG, W64, ids)


def test_a_bad_cache_is_refused_and_nothing_is_written():
    ids = IDS[:, :3]
    with pytest.raises(TypeError, match="a list of one per layer is no longer taken"):
        kv.forward(CONFIG, W64, ids, cache=[kv.DynamicCache(), kv.DynamicCache()])
    wrong_batch = caches("dynamic")
    wrong_batch.update(np.zeros((3, 2, 0, 6)), np.zeros((3, 2, 0, 6)), 1)  # layer 1 fixed at B = 3
    with pytest.raises(ValueError, match=r"cache layer 1 holds batch shape \(3, 2\)"):
        kv.forward(CONFIG, W64, ids, cache=wrong_batch)
    assert lengths(wrong_batch) == ["0", "0"]  # layer 0 fitted but was not written
    short = caches("static", max_seq_len=5)
    kv.forward(CONFIG, W64, ids, cache=short)
    with pytest.raises(kv.StaticCacheFullError, match=r"cache is too short: 3 of max_seq_len=5"):
        kv.forward(CONFIG, W64, ids, cache=short)
    assert lengths(short) == ["3", "3"]
    views = paged_views(num_blocks=2, block_size=4)  # 2 sequences of 3 tokens fill the pool; a 5th token does not fit
    kv.forward(CONFIG, W64, ids, cache=views)
    with pytest.raises(kv.OutOfBlocksError):
        kv.forward(CONFIG, W64, IDS[:, :2], cache=views)
    assert lengths(views) == [str(np.array([3, 3]))] * 2



def layer_1_of(cache, k, v):
    """``cache`` whose layer 1 was written ``k``, ``v`` by hand (a user's update(k, v, 1)): it may not fit the rest."""
    cache.update(k, v, 1)
    return cache


@pytest.mark.parametrize("make, error, message", [
    (lambda: layer_1_of(kv.DynamicCache(), np.zeros((2, 2, 0, 6), np.float32), np.zeros((2, 2, 0, 6), np.float32)),
     TypeError, r"cache layer 1 stores float32"),
    (lambda: layer_1_of(kv.DynamicCache(), np.zeros((2, 2, 0, 6)), np.zeros((2, 2, 0, 4))), ValueError,
     r"cache layer 1 holds batch shape \(2, 2\), k, v widths \[6, 4\]; needed \(\(2, 2\), 6, 6\)"),
    (lambda: layer_1_of(kv.StaticCache((2, 2), 8, 6, 6), np.zeros((2, 2, 1, 6)), np.zeros((2, 2, 1, 6))), ValueError,
     r"the layers hold different lengths \['0', '1'\]"),
    (lambda: kv.StaticCache((2, 2), 8, 6, 4), ValueError, r"cache layer 0 holds batch shape .* widths \[6, 4\]"),
    (lambda: kv.StaticCache((2, 2), 8, 6, 6, np.float32), TypeError, r"cache layer 0 stores float32"),
    (lambda: (lambda c: c.layer(2) and c)(kv.DynamicCache()), ValueError,
     "cache holds 3 layers, more than num_hidden_layers=2"),
    (lambda: [kv.DynamicCache()] * 2, TypeError, "a list of one per layer is no longer taken"),
    (lambda: paged_views().cache, TypeError, "cache must be one object of every layer.* or a PagedCacheView"),
    (lambda: "abc", TypeError, "cache must be one object of every layer, .* got 'abc'"),
])
def test_every_layer_is_checked_before_any_is_written(make, error, message):
    cache = make()
    with pytest.raises(error, match=message):
        kv.forward(CONFIG, W64, IDS[:, :3], cache=cache)
    for c in cache.layers if isinstance(cache, kv.Cache) else []:
        assert c.get_seq_length() <= ("lengths" in message) and not np.any(c.k_cache)  # None, or a StaticCache's zeros


def test_a_paged_cache_of_another_number_of_layers_is_refused():
    view = paged_views(config=kv.ModelConfig(**{**CONFIG.__dict__, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="num_hidden_layers=2 .* got a PagedCacheView of 3 layers"):
        kv.forward(CONFIG, W64, IDS[:, :3], cache=view)
    assert view.get_seq_length().tolist() == [0, 0]


def test_a_paged_view_of_a_sequence_freed_since_is_refused_and_nothing_is_written():
    view = paged_views(batch=2)
    view.cache.free(1)
    free = view.cache.block_pool.free_blocks()
    with pytest.raises(ValueError, match=r"sequence 1 is not in the cache; known: \[0\]"):
        kv.forward(CONFIG, W64, IDS, cache=view)
    assert view.cache.get_seq_length(0) == 0 and view.cache.block_pool.free_blocks() == free


def test_a_paged_view_whose_token_ids_are_not_input_ids_is_refused():
    pool = paged_views(batch=1, num_blocks=16, enable_prefix_caching=True).cache
    ids = IDS[:1, :5]
    with pytest.raises(ValueError, match=r"cache.token_ids must be input_ids"):
        kv.forward(CONFIG, W64, ids, cache=kv.PagedCacheView(pool, [0], token_ids=ids + 1))
    assert pool.get_seq_length(0) == 0 and pool.block_pool.num_cached_blocks == 0
    got = kv.forward(CONFIG, W64, ids, cache=kv.PagedCacheView(pool, [0], token_ids=ids))
    np.testing.assert_allclose(got, FULL[:1, :5], **TOL)
    assert pool.add_sequence(1, IDS[0, :9]) == 4  # the block of ids, cached under ids
    with pytest.raises(ValueError, match=r"a generate of more than one token takes none"):  # not its new tokens
        kv.generate(CONFIG, W64, ids, 3, cache=kv.PagedCacheView(pool, [1], token_ids=ids))
    assert pool.get_seq_length(1) == 4


@pytest.mark.parametrize("kind", [None, "dynamic", "static", "paged"])
def test_no_tokens_where_the_cache_holds_none_is_refused(kind):
    cache = None if kind is None else make_cache(kind)
    with pytest.raises(ValueError, match="input_ids must hold at least one token"):
        kv.forward(CONFIG, W64, IDS[:, :0], cache=cache)
    if cache is not None:  # once it holds tokens, an empty chunk is empty logits
        kv.forward(CONFIG, W64, IDS[:, :2], cache=cache)
        assert kv.forward(CONFIG, W64, IDS[:, :0], cache=cache).shape == (2, 0, CONFIG.vocab_size)
        np.testing.assert_allclose(kv.forward(CONFIG, W64, IDS[:, 2:4], cache=cache), FULL[:, 2:4], **TOL)


def test_generate_from_no_tokens_is_refused_even_where_the_cache_holds_some():
    cache = caches("static")
    kv.forward(CONFIG, W64, IDS[:, :2], cache=cache)
    with pytest.raises(ValueError, match=r"input_ids must hold at least one token to generate from"):
        kv.generate(CONFIG, W64, IDS[:, :0], 3, cache=cache)
    assert lengths(cache) == ["2", "2"]
    assert kv.generate(CONFIG, W64, IDS[:, :0], 0, cache=cache).shape == (2, 0)  # no new token: nothing to refuse


@pytest.mark.parametrize("kind", ["dynamic", "static", "window", "quantized"])
def test_each_cache_kind_gives_the_layout_an_update_must_fit_and_checks_its_room(kind):
    c = make_cache(kind)
    fixed = ((2, CONFIG.num_key_value_heads), CONFIG.head_dim, CONFIG.head_dim, np.dtype(np.float64))
    assert c.layout == ((None,) * 4 if kind == "dynamic" else fixed)
    assert kv.DynamicCache(np.float32).layout == (None, None, None, np.dtype(np.float32))  # fixed before an update
    kv.forward(CONFIG, W64, IDS[:, :3], cache=c)
    assert c.layout == fixed and all(layer.layout == fixed for layer in c.layers) and len(c.layers) == 2
    room = {"static": 32 - 3}.get(kind, 10**6)  # max_seq_len=32; no max_seq_len
    c.check_update(2, *fixed[:3], np.float64, room)
    if kind == "static":
        with pytest.raises(kv.StaticCacheFullError, match="3 of max_seq_len=32 positions used, the call writes 30"):
            c.check_update(2, *fixed[:3], np.float64, room + 1)
    assert np.all(c.get_seq_length() == 3) and c.get_seq_length(1) == 3


def stored(cache):
    """Each layer's length and the K/V it holds (a paged view's: each sequence's tokens, gathered), as copies."""
    if isinstance(cache, kv.PagedCacheView):
        out = []
        for layer in range(cache.cache.num_layers):
            k, v, n = cache.cache.gather(cache.seq_ids, layer)
            out.append([n] + [np.concatenate([a[i, :m] for i, m in enumerate(n)]) for a in (k, v)])
        return out
    return [[c.get_seq_length()] + [None if a is None else a.copy() for a in (c.k_cache, c.v_cache)]
            for c in cache.layers]


def nan_in_layer_1():
    w = dict(W64)
    w["model.layers.1.self_attn.k_proj.weight"] = w["model.layers.1.self_attn.k_proj.weight"].copy()
    w["model.layers.1.self_attn.k_proj.weight"][0, 0] = np.nan
    return w


@pytest.mark.parametrize("chunk", [3, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_a_nan_in_a_later_layer_crops_the_layers_written_back(kind, chunk):
    # layer 0 writes its k/v, then layer 1's k is NaN and its cache refuses it: layer 0's cache is cropped back,
    # and the next call gives the logits of a run that never failed
    cache = make_cache(kind)
    kv.forward(CONFIG, W64, IDS[:, :5], cache=cache)
    before = stored(cache)
    with pytest.raises(ValueError, match="k contains NaN"):
        kv.forward(CONFIG, nan_in_layer_1(), IDS[:, 5 : 5 + chunk], cache=cache)
    for (n, k, v), (n_was, k_was, v_was) in zip(stored(cache), before):
        np.testing.assert_array_equal(n, n_was)
        np.testing.assert_array_equal(k, k_was)
        np.testing.assert_array_equal(v, v_was)
    np.testing.assert_allclose(cached_logits(cache, IDS[:, 5:], [chunk, 6 - chunk]), FULL[:, 5:], **TOL)


@pytest.mark.parametrize("config, weights, error, message", [
    ("x", W64, TypeError, "config must be a ModelConfig, got str"),
    (CONFIG, {**W64, "model.norm.weight": list(W64["model.norm.weight"])}, ValueError,
     r"weights\['model.norm.weight'\]"),
    (CONFIG, {**W64, "model.norm.weight": np.ma.masked_array(W64["model.norm.weight"])}, ValueError,
     r"weights\['model.norm.weight'\]"),
])
def test_a_config_or_weight_of_another_type_is_named(config, weights, error, message):
    with pytest.raises(error, match=message):
        kv.forward(config, weights, IDS)


def test_a_failed_paged_call_caches_no_block_it_filled_and_every_layer_stays_as_it_was():
    """The failed call fills block 1 (positions 4..7) in layer 0, then layer 1 refuses its NaN k: one state for
    every layer, back at 5 tokens, block 1 not cached (layer 1 never wrote it); the continuation then caches it."""
    pool = paged_views(batch=1, num_blocks=16, enable_prefix_caching=True).cache
    ids = IDS[:1]

    def run(w, start, stop):
        chunk = ids[:, start:stop]
        return kv.forward(CONFIG, w, chunk, cache=kv.PagedCacheView(pool, [0], token_ids=chunk))

    run(W64, 0, 5)
    before = stored(kv.PagedCacheView(pool, [0]))
    with pytest.raises(ValueError, match="contains NaN"):
        run(nan_in_layer_1(), 5, 8)
    assert pool.get_seq_length(0) == 5 and len(pool.find_cached_blocks(ids[0, :8])) == 1
    for (n, k, v), (n_was, k_was, v_was) in zip(stored(kv.PagedCacheView(pool, [0])), before):
        np.testing.assert_array_equal(n, n_was)
        np.testing.assert_array_equal(k, k_was)
        np.testing.assert_array_equal(v, v_was)
    np.testing.assert_allclose(run(W64, 5, 11), FULL[:1, 5:], **TOL)
    assert pool.get_seq_length(0) == 11 and len(pool.find_cached_blocks(ids[0, :8])) == 2


def pool_state(pool):
    """Everything about a paged pool that a failed call must leave as it was: each sequence's block table, length
    and stored K/V in every layer, each block's refcount and whether it is cached, the free queue in order, the peak,
    and each sequence's recorded token ids and block hashes (prefix caching: what its next blocks are cached by)."""
    ids, view = pool.seq_ids, kv.PagedCacheView(pool, pool.seq_ids)
    return dict(
        tables=[pool.block_table(s) for s in ids], lengths=[pool.get_seq_length(s) for s in ids],
        stored=[[a.tolist() for a in layer] for layer in stored(view)] if ids else [],
        ref_counts=[pool.ref_count(b) for b in range(pool.num_blocks)],
        cached=[pool.block_pool.is_cached(b) for b in range(pool.num_blocks)],
        free_queue=pool.block_pool.free_blocks(), num_free=pool.num_free_blocks, peak=pool.peak_blocks,
        token_ids=repr(pool._token_ids), block_hashes=repr(pool._block_hashes), num_cached=repr(pool._num_cached),
    )


def paged_forward(pool, seq_ids, ids, w=W64, record=True):
    """forward of ``ids [N, T]`` through a view of ``seq_ids``, with the token ids recorded if ``record``."""
    return kv.forward(CONFIG, w, ids, cache=kv.PagedCacheView(pool, seq_ids, token_ids=ids if record else None))


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("case", ["new blocks", "a forked shared last block", "without token ids"])
def test_a_failed_paged_forward_leaves_the_pool_exactly_as_it_was(case, caching):
    # a: 3 tokens in block 0; the failed call writes 8 more in layer 0 (blocks 1 and 2, and for the fork b a copy
    # of the shared block 0), then layer 1 refuses its NaN k. A crop gave the new blocks back tail first (the free
    # queue reordered), kept the copy (b's table changed, one block fewer free) and the "no token ids" mark that
    # ends a sequence's prefix caching, and left the peak raised.
    pool = paged_views(batch=0, num_blocks=8, enable_prefix_caching=caching).cache
    pool.add_sequence("a")
    paged_forward(pool, ["a"], IDS[:1, :3])
    seq = "a"
    if case == "a forked shared last block":
        pool.fork("a", "b")
        seq = "b"
    before = pool_state(pool)
    assert before["num_free"] == 7
    with pytest.raises(ValueError, match="k contains NaN"):
        paged_forward(pool, [seq], IDS[:1, 3:], nan_in_layer_1(), record=case != "without token ids")
    assert pool_state(pool) == before
    # the continuation gives the logits of a run that never failed, and caches its full blocks
    np.testing.assert_allclose(paged_forward(pool, [seq], IDS[:1, 3:]), FULL[:1, 3:], **TOL)
    assert len(pool.find_cached_blocks(IDS[0])) == (2 if caching else 0)


def test_a_failed_paged_forward_gives_back_the_cached_blocks_it_took_with_their_contents():
    # x's full block 0 is cached and freed: the free queue is 1, 2, 3, 0. The failed call of y takes all four,
    # evicting block 0 and writing over it in layer 0; afterwards block 0 is cached again, with x's K/V.
    pool = paged_views(batch=0, num_blocks=4, enable_prefix_caching=True).cache
    pool.add_sequence("x")
    paged_forward(pool, ["x"], IDS[:1, :4])
    x_kv = stored(kv.PagedCacheView(pool, ["x"]))
    pool.free("x")
    pool.add_sequence("y")
    before = pool_state(pool)
    assert before["free_queue"] == (1, 2, 3, 0) and before["cached"] == [True, False, False, False]
    with pytest.raises(ValueError, match="contains NaN"):
        paged_forward(pool, ["y"], tokens((1, 13), seed=5), nan_in_layer_1())  # 13 tokens: 4 blocks
    assert pool_state(pool) == before
    assert pool.add_sequence("z", IDS[0, :5]) == 4  # the hit: block 0, as x wrote it
    for (n, k, v), (n_x, k_x, v_x) in zip(stored(kv.PagedCacheView(pool, ["z"])), x_kv):
        np.testing.assert_array_equal(n, n_x)
        np.testing.assert_array_equal(k, k_x)
        np.testing.assert_array_equal(v, v_x)


@pytest.mark.parametrize("kind", KINDS + ("forked paged",))
def test_a_generate_whose_third_step_raises_leaves_the_cache_as_before_the_call(kind, monkeypatch):
    # the prefill and the first decode step write, then the third call's layer 1 refuses its NaN k: the steps that
    # succeeded are taken back too, and the pool's blocks (a forked sequence's shared block: held again) as before
    if "paged" in kind:
        pool = paged_views(batch=0, num_blocks=16, enable_prefix_caching=True).cache
        pool.add_sequence("a")
        paged_forward(pool, ["a"], IDS[:1, :3])
        if kind == "forked paged":
            pool.fork("a", "b")
        cache = kv.PagedCacheView(pool, pool.seq_ids[-1:])
        state = lambda: pool_state(pool)  # noqa: E731
    else:
        cache = make_cache(kind)
        kv.forward(CONFIG, W64, IDS[:1, :3].repeat(2, axis=0), cache=cache)
        state = lambda: [[np.asarray(a).tolist() for a in layer] for layer in stored(cache)]  # noqa: E731
    before, calls, real = state(), [], kv.model._forward

    def third_fails(config, weights, ids, *args):
        calls.append(ids.shape)
        return real(config, nan_in_layer_1() if len(calls) == 3 else weights, ids, *args)

    monkeypatch.setattr(kv.model, "_forward", third_fails)
    ids = IDS[:1, 3:6] if "paged" in kind else IDS[:, 3:6]
    with pytest.raises(ValueError, match="contains NaN"):
        kv.generate(CONFIG, W64, ids, 4, cache=cache)
    assert calls == [ids.shape, (len(ids), 1), (len(ids), 1)] and state() == before


def test_a_crop_inside_a_cached_block_then_a_write_leaves_the_cached_block_as_it_was():
    pool = kv.PagedKVCache(4, 4, 2, 2, enable_prefix_caching=True)
    tokens = np.arange(4)
    pool.add_sequence("a")
    pool.update(["a"], np.ones((1, 4, 2)), np.ones((1, 4, 2)), token_ids=tokens[None])
    pool.fork("a", "b")
    pool.crop("b", 2)
    pool.free("a")  # b now holds the cached block alone
    pool.update(["b"], np.full((1, 2, 2), 7.0), np.full((1, 2, 2), 7.0))
    assert pool.add_sequence("c", tokens) == 4  # the whole block found
    k, _, _ = pool.gather(["b", "c"])
    np.testing.assert_array_equal(k[0][:, 0], [1, 1, 7, 7])
    np.testing.assert_array_equal(k[1][:, 0], [1, 1, 1, 1])


@pytest.mark.parametrize("edit, message", [
    (lambda w: w.pop("model.layers.1.mlp.up_proj.weight"), r"missing \['model.layers.1.mlp.up_proj.weight'\]"),
    (lambda w: w.update({"model.layers.2.mlp.up_proj.weight": w["model.norm.weight"]}),
     r"unexpected \['model.layers.2.mlp.up_proj.weight'\]"),
    (lambda w: w.update({"lm_head.weight": w["lm_head.weight"][:, :5]}),
     r"weights\['lm_head.weight'\] must be a float array of shape \(61, 24\)"),
    (lambda w: w.update({"model.norm.weight": np.ones(24, dtype=np.int64)}), r"weights\['model.norm.weight'\]"),
])
def test_bad_weights_are_named_and_nothing_is_written(edit, message):
    w = dict(W64)
    edit(w)
    cache = caches("dynamic")
    with pytest.raises(ValueError, match=message):
        kv.forward(CONFIG, w, IDS, cache=cache)
    assert lengths(cache) == ["0", "0"]


@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_paged_attention_is_grouped_query_attention_with_a_bottom_right_causal_mask(num_kv_heads):
    rng = np.random.default_rng(9)
    heads = () if num_kv_heads is None else (2,)
    pool = kv.PagedKVCache(16, 3, 4, 5, num_kv_heads=num_kv_heads)
    assert pool.k_cache.shape == (16, 3, *heads, 4) and pool.num_kv_heads == num_kv_heads
    k = {s: rng.standard_normal((n, *heads, 4)) for s, n in (("a", 7), ("b", 4))}
    v = {s: rng.standard_normal((n, *heads, 5)) for s, n in (("a", 7), ("b", 4))}
    for s in k:
        pool.add_sequence(s)
        pool.update([s], k[s][None], v[s][None])
    pool.fork("b", "c")  # c shares b's partial last block: its next write copies it
    pool.update(["c"], rng.standard_normal((1, 1, *heads, 4)), rng.standard_normal((1, 1, *heads, 5)))
    gathered_k, _, lengths = pool.gather(["a", "b"])
    np.testing.assert_array_equal(gathered_k[1, :4], k["b"])  # b's block was not written by c
    n_heads = 1 if num_kv_heads is None else 6
    q = rng.standard_normal((2, n_heads, 3, 4))  # [N, H_q, T_q, D]: the last 3 positions of each sequence
    for causal in (False, True):
        out = kv.paged_attention(q[:, 0] if num_kv_heads is None else q, pool, ["a", "b"], causal=causal)
        out = out[:, None] if num_kv_heads is None else out  # [N, H_q, T_q, D_v]
        for i, s in enumerate(k):
            n = len(k[s])
            keys, values = k[s].reshape(n, -1, 4), v[s].reshape(n, -1, 5)  # [n, H_kv, D]
            for h in range(n_heads):
                for t in range(3):
                    allowed = [p for p in range(n) if not causal or attends(n - 3 + t, p)]
                    expected = naive_attend(q[i, h, t][None], keys[allowed, h // 3], values[allowed, h // 3])[0]
                    np.testing.assert_allclose(out[i, h, t], expected, rtol=1e-12, atol=1e-12)


def test_serve_gives_each_request_its_own_generate():
    rng = np.random.default_rng(11)
    system = rng.integers(0, 61, 8).tolist()  # a shared prefix: prefix caching hits
    requests = [kv.Request(i, system + rng.integers(0, 61, int(rng.integers(3, 12))).tolist(), int(rng.integers(9, 12)),
                           arrival_step=i // 2) for i in range(6)]
    expected = {r.request_id: kv.generate(CONFIG, W64, [r.token_ids[: r.prompt_len]],
                                          len(r.token_ids) - r.prompt_len + 1)[0, r.prompt_len:] for r in requests}
    for num_blocks, caching in ((100, False), (12, True), (8, False)):
        result = kv.serve(requests, model=(CONFIG, W64), block_size=4, num_blocks=num_blocks,
                          max_num_batched_tokens=10, enable_prefix_caching=caching)
        assert list(result.outputs) == [r.request_id for r in requests]
        for r in requests:
            assert result.outputs[r.request_id].dtype == np.int64
            np.testing.assert_array_equal(result.outputs[r.request_id], expected[r.request_id], err_msg=str(r))
        if num_blocks == 8:
            assert result.stats.preemptions > 0  # the tight pool recomputed prefixes, generated tokens included
        if caching:
            assert result.stats.prefix_hit_tokens > 0


def test_serve_takes_either_the_single_head_or_the_model():
    with pytest.raises(ValueError, match="either embedding"):
        kv.serve([], np.ones((3, 2)), model=(CONFIG, W64), num_blocks=1, max_num_batched_tokens=1)
    with pytest.raises(ValueError, match="missing"):
        kv.serve([], model=(CONFIG, {}), num_blocks=1, max_num_batched_tokens=1)
    with pytest.raises(ValueError, match=r"token_ids\[1\] = 61"):
        kv.serve([kv.Request("a", [1, 61, 2], 2)], model=(CONFIG, W64), num_blocks=4, max_num_batched_tokens=4)


def test_transformers_llama_gives_the_same_logits_and_tokens(monkeypatch):
    # Even in a float64 model transformers rounds its RoPE tables (LlamaRotaryEmbedding) and each RMSNorm's
    # normalised x (LlamaRMSNorm: hidden_states.to(torch.float32)) through float32, and its eager attention's
    # softmax too (sdpa's is float64): logits agree to about 1e-6; with those two roundings copied, to 1e-12.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.LlamaConfig(**CONFIG.__dict__, max_position_embeddings=64)
    hf_config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(hf_config).to(torch.float64).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in W64.items()}, strict=False)
    assert not unexpected and not missing
    with torch.no_grad():
        hf_logits = model(torch.from_numpy(IDS)).logits.numpy()
        hf_tokens = model.generate(torch.from_numpy(IDS[:, :4]), max_new_tokens=7, do_sample=False,
                                   pad_token_id=0).numpy()
    print(f"max |logits - transformers'| = {np.abs(FULL - hf_logits).max():.3g}")
    np.testing.assert_allclose(FULL, hf_logits, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(kv.generate(CONFIG, W64, IDS[:, :4], 7, cache=caches("dynamic")), hf_tokens)

    def hf_tables(positions, head_dim, theta, dtype):
        cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float64), torch.from_numpy(positions)[None])
        return cos[0].numpy(), sin[0].numpy()

    def float32_norm(x, weight, eps):
        x = torch.from_numpy(x).to(torch.float32)
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(torch.float64).numpy()

    monkeypatch.setattr(kv.model, "rope_tables", hf_tables)
    monkeypatch.setattr(kv.model, "rms_norm", float32_norm)
    with_roundings = kv.forward(CONFIG, W64, IDS)
    print(f"with transformers' float32 roundings: {np.abs(with_roundings - hf_logits).max():.3g}")
    np.testing.assert_allclose(with_roundings, hf_logits, rtol=0, atol=1e-12)


# Every call atomic: one snapshot/restore (kv_attention.cache.atomic) for every kind


def full_state(cache):
    """Everything a failed call must leave as it was: a paged pool's :func:`pool_state`; of a Cache, every attribute
    of every layer (buffers bit for bit past the length too, a ring's order, quantized codes), and its layers."""
    if isinstance(cache, kv.PagedCacheView):
        return pool_state(cache.cache)

    def plain(x):
        if isinstance(x, np.ndarray):
            return x.dtype.str, x.shape, x.tobytes()
        return [plain(a) for a in x] if isinstance(x, (tuple, list)) else repr(x)

    return [{name: plain(value) for name, value in vars(c).items() if name != "_more"} for c in cache.layers]


ATOMIC_KINDS = ("dynamic", "static", "window", "quantized", "paged", "prefix-caching paged")


def filled(kind, batch=2):
    """A cache of ``kind`` holding IDS[:, :5] (a window of 4: its ring has wrapped; quantized: blocks quantized)."""
    if "paged" in kind:
        cache = paged_views(batch=batch, num_blocks=24, enable_prefix_caching="prefix" in kind)
    else:
        cache = caches(kind, batch=batch, window=4)
    kv.forward(CONFIG, W64, IDS[:batch, :5], cache=cache)
    return cache


def failing(monkeypatch, where):
    """Make the model raise where the name says; returns the weights to call with."""
    if where == "a NaN weight in layer 0":
        w = dict(W64)
        w["model.layers.0.self_attn.v_proj.weight"] = np.full_like(w["model.layers.0.self_attn.v_proj.weight"], np.nan)
        return w
    if where == "a NaN weight in layer 1":
        return nan_in_layer_1()
    real_linear, real_norm = kv.model.linear, kv.model.rms_norm
    if where == "MemoryError in the logits":
        def linear(x, w):
            if w.shape[0] == CONFIG.vocab_size:
                raise MemoryError("Unable to allocate the logits")
            return real_linear(x, w)
        monkeypatch.setattr(kv.model, "linear", linear)
    else:  # KeyboardInterrupt in the final norm, after every layer wrote
        def rms_norm(x, weight, eps):
            if weight is W64["model.norm.weight"]:
                raise KeyboardInterrupt
            return real_norm(x, weight, eps)
        monkeypatch.setattr(kv.model, "rms_norm", rms_norm)
    return W64


FAILURES = ("a NaN weight in layer 0", "a NaN weight in layer 1", "MemoryError in the logits",
            "KeyboardInterrupt in the final norm")
ERRORS = {"a NaN weight in layer 0": ValueError, "a NaN weight in layer 1": ValueError,
          "MemoryError in the logits": MemoryError, "KeyboardInterrupt in the final norm": KeyboardInterrupt}


@pytest.mark.parametrize("where", FAILURES)
@pytest.mark.parametrize("call", ["forward", "generate"])
@pytest.mark.parametrize("kind", ATOMIC_KINDS)
def test_a_call_that_fails_anywhere_leaves_every_kind_exactly_as_before_and_raises_its_own_error(
        kind, call, where, monkeypatch):
    cache = filled(kind)
    before, w = full_state(cache), failing(monkeypatch, where)
    with pytest.raises(ERRORS[where], match="contains NaN" if "NaN" in where else None) as raised:
        if call == "forward":
            kv.forward(CONFIG, w, IDS[:, 5:8], cache=cache)
        else:
            kv.generate(CONFIG, w, IDS[:, 5:8], 3, cache=cache)
    assert raised.value.__context__ is None and raised.type is ERRORS[where]  # the original, no cleanup error
    assert full_state(cache) == before
    monkeypatch.undo()  # the continuation gives the logits of a run that never failed
    expected = FULL[:, 5:8] if kind != "window" else naive_llama_forward(CONFIG, W64, IDS[:, :8], window=4)[:, 5:]
    if kind != "quantized":
        np.testing.assert_allclose(kv.forward(CONFIG, W64, IDS[:, 5:8], cache=cache), expected, **TOL)


@pytest.mark.parametrize("step", [1, 2, 3, 5])
@pytest.mark.parametrize("kind", ["dynamic", "static", "paged", "prefix-caching paged"])
def test_a_prompt_lookup_interrupted_at_any_forward_takes_back_every_step_and_its_crops(kind, step, monkeypatch):
    # The prompt repeats itself: drafts are made, some rejected and cropped off, before the interrupted forward.
    prompt = np.tile(np.arange(1, 9), 3)[None, :-5]
    cache = paged_views(batch=1, num_blocks=24, enable_prefix_caching="prefix" in kind) if "paged" in kind \
        else caches(kind, batch=1)
    kv.forward(CONFIG, W64, prompt[:, :4], cache=cache)
    before, calls, real = full_state(cache), [], kv.model._forward

    def interrupted(*args):
        calls.append(args[2].shape[1])
        if len(calls) == step:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(kv.model, "_forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        kv.prompt_lookup_generate(CONFIG, W64, prompt[:, 4:], 12, cache=cache, prompt_lookup_num_tokens=4)
    assert full_state(cache) == before and len(calls) == step
    monkeypatch.undo()
    tokens, stats = kv.prompt_lookup_generate(CONFIG, W64, prompt[:, 4:], 12, cache=cache, prompt_lookup_num_tokens=4)
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0  # the interrupted runs had crops to undo
    np.testing.assert_array_equal(tokens[:, 4:], kv.generate(CONFIG, W64, prompt, 12)[:, 8:])


def test_a_one_token_generate_through_a_prefix_caching_view_that_fails_after_the_layers_leaks_nothing(monkeypatch):
    pool = paged_views(batch=1, num_blocks=6, enable_prefix_caching=True).cache
    ids = IDS[:1, :8]  # two full blocks, cached only once the whole call succeeded
    before = pool_state(pool)
    failing(monkeypatch, "MemoryError in the logits")
    with pytest.raises(MemoryError, match="Unable to allocate the logits") as raised:
        kv.generate(CONFIG, W64, ids, 1, cache=kv.PagedCacheView(pool, [0], token_ids=ids))
    assert raised.value.__context__ is None and pool_state(pool) == before and pool.num_free_blocks == 6
    monkeypatch.undo()
    out = kv.generate(CONFIG, W64, ids, 1, cache=kv.PagedCacheView(pool, [0], token_ids=ids))
    np.testing.assert_array_equal(out, kv.generate(CONFIG, W64, ids, 1))
    assert len(pool.find_cached_blocks(ids[0])) == 2


@pytest.mark.parametrize("kind", ["static", "paged"])
def test_a_call_past_the_room_is_refused_whole_and_leaves_the_cache_as_it_was(kind):
    # paged: 2 blocks of 4 a sequence, 1 free: sequence 0's reservation takes it, then sequence 1's fails
    cache = paged_views(num_blocks=5, block_size=4) if kind == "paged" else caches("static", max_seq_len=9)
    kv.forward(CONFIG, W64, IDS[:, :5], cache=cache)  # 5 positions of each sequence
    before = full_state(cache)
    with pytest.raises(kv.OutOfBlocksError if kind == "paged" else kv.StaticCacheFullError):
        kv.generate(CONFIG, W64, IDS[:, 5:7], 4, cache=cache)  # 5 more
    assert full_state(cache) == before


def test_no_call_writes_into_or_returns_a_callers_array_and_read_only_arrays_work():
    prompt = np.tile(np.arange(1, 9), 3)[None, :-5]
    prompt.flags.writeable = False
    held, expected = prompt.copy(), kv.generate(CONFIG, W64, prompt.copy(), 6)
    for kind in ("static", "paged"):
        for k in (None, 3):
            cache = paged_views(batch=1) if kind == "paged" else caches("static", batch=1)
            out = kv.generate(CONFIG, W64, prompt, 6, cache=cache, prompt_lookup_num_tokens=k)
            np.testing.assert_array_equal(out, expected)
            assert not np.shares_memory(out, prompt)
            out[:] = 0  # the caller's own array
    for k in (None, 3):
        out = kv.generate(CONFIG, W64, prompt, 0, cache=caches("dynamic", batch=1), prompt_lookup_num_tokens=k)
        assert out.flags.writeable and not np.shares_memory(out, prompt)
    pool = paged_views(batch=1, enable_prefix_caching=True).cache
    logits = kv.forward(CONFIG, W64, prompt, cache=kv.PagedCacheView(pool, [0], token_ids=prompt))
    np.testing.assert_allclose(logits, kv.forward(CONFIG, W64, held), **TOL)
    np.testing.assert_array_equal(prompt, held)


def test_kv_attention_has_no_import_circle():
    import ast
    import pathlib

    package = pathlib.Path(kv.__file__).parent
    imports = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        imports[path.stem] = {node.module.split(".")[0] for node in ast.walk(tree)
                              if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    done, visiting = set(), []

    def visit(module):
        assert module not in visiting, f"import circle: {' -> '.join(visiting[visiting.index(module):] + [module])}"
        if module in done or module not in imports:
            return
        visiting.append(module)
        for imported in imports[module]:
            visit(imported)
        visiting.pop()
        done.add(module)

    for module in imports:
        if module != "__init__":
            visit(module)
