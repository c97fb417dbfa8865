"""Roofline: the bytes a step reads, the step oracle, the check, the points left out, and the fraction of the read
bandwidth a step reaches, paired, measured in setup_cache and replayed."""

import functools

import numpy as np
import pytest

import kv_attention as kv
from answers import bench_roofline as answer
from benchmarks import bench_roofline, pairs
from tests.references import heads_problem, naive_multi_head
from .conftest import asv_listing

TINY = {"Tiny-GQA": kv.ModelShape(n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8),
        "Tiny-MHA": kv.ModelShape(n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8)}


@pytest.fixture
def tiny_shapes(monkeypatch):
    """MODEL_SHAPES holding two tiny shapes, and no input of an earlier test held."""
    monkeypatch.setattr(kv, "MODEL_SHAPES", TINY)
    for cached in (answer.layer_weights, answer.new_position):
        cached.cache_clear()
    answer._FILLED.clear()
    yield
    for cached in (answer.layer_weights, answer.new_position):
        cached.cache_clear()
    answer._FILLED.clear()


def nbytes(*shapes):
    """float32 bytes of arrays of these shapes."""
    return sum(4 * int(np.prod(shape)) for shape in shapes)


def test_the_bytes_of_a_step_are_its_weights_its_cache_and_repeat_kvs_copies():
    # Llama-3-8B: D_model 4096, 32 query heads, 8 K/V heads of 128; the 192 MiB at T = 4096, B = 1.
    weights = nbytes((4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096))
    kv_4096 = nbytes((1, 8, 4097, 128), (1, 8, 4097, 128))  # K and V of 4096 cached positions and the new one
    assert weights == 160 * 2**20
    assert bench_roofline.step_bytes("Llama-3-8B", 4096, 1, "grouped") == weights + kv_4096
    copies = nbytes((1, 32, 4097, 128), (1, 32, 4097, 128))  # repeat_kv: K and V for all 32 query heads
    assert bench_roofline.step_bytes("Llama-3-8B", 4096, 1, "repeat_kv") == weights + kv_4096 + copies
    # Llama-2-7B is MHA: repeat_kv uses the cache's views, no copies; the 768 MiB at T = 16384.
    mha = nbytes(*[(4096, 4096)] * 4, (1, 32, 16385, 128), (1, 32, 16385, 128))
    assert bench_roofline.step_bytes("Llama-2-7B", 16384, 1, "repeat_kv") == bench_roofline.step_bytes("Llama-2-7B", 16384, 1, "grouped") == mha
    assert 768 * 2**20 < mha < 769 * 2**20


def test_points_over_two_gib_or_over_4096_positions_are_left_out_with_the_reason():
    # Llama-2-7B at B = 4, T = 16384: K and V alone are 2 x 4 x 32 x 16385 x 128 x 4 bytes, over 2 GiB.
    assert nbytes((4, 32, 16385, 128)) * 2 > 2 * 2**30
    assert "over the experiment's 2 GiB" in answer.not_measured("Llama-2-7B", 16384, 4, "grouped")
    # Llama-3-8B repeat_kv at B = 4, T = 16384 copies 2 GiB per step.
    assert "over the experiment's 2 GiB" in answer.not_measured("Llama-3-8B", 16384, 4, "repeat_kv")
    assert "B = 1 only" in answer.not_measured("Llama-3-8B", 16384, 4, "grouped")
    assert "B x T = 16384 cached positions" in answer.not_measured("Llama-2-7B", 4096, 4, "grouped")
    measured = [(s, t, b, p) for s in bench_roofline.ROOFLINE_SHAPES for t in bench_roofline.ROOFLINE_LENGTHS for b in bench_roofline.ROOFLINE_BATCHES
                for p in bench_roofline.ROOFLINE_PATHS if answer.not_measured(s, t, b, p) is None]
    assert len(measured) == 12 and all(b == 1 or t == 1024 for _, t, b, _ in measured)
    assert "G = 1" in answer.not_measured("Llama-2-7B", 1024, 1, "repeat_kv")  # the grouped step again


def test_the_step_oracle_is_the_last_position_of_causal_multi_head_attention():
    t_len, n_heads, n_kv_heads, head_dim = 11, 6, 2, 3
    x, w_q, w_k, w_v, w_o = heads_problem(t_len + 1, batch=2, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                          head_dim=head_dim)
    expected = naive_multi_head(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads)[:, t_len:]  # [2, 1, D_out]
    heads = (2, t_len, n_kv_heads, head_dim)
    k, v = ((x[:, :t_len] @ w).reshape(heads).transpose(0, 2, 1, 3) for w in (w_k, w_v))  # [2, H_kv, T, D_head]
    q, k_new, v_new = (x[:, t_len] @ w for w in (w_q, w_k, w_v))
    chunks = [slice(0, 4), slice(4, 9), slice(9, t_len)]  # chunks of any length, in order
    out = answer.step_oracle(q, k_new, v_new, [k[..., c, :] for c in chunks], [v[..., c, :] for c in chunks], w_o,
                         n_heads, n_kv_heads)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_the_cache_holds_t_positions_of_the_drawn_k_and_v_in_chunks(tiny_shapes):
    t_len = answer.CHUNK + 88  # two chunks, the second short
    cache, expected = answer.filled_cache("Tiny-GQA", t_len, 2)
    assert cache.get_seq_length() == t_len and cache.max_seq_len == t_len + 1
    k = np.concatenate(list(answer.kv_chunks("Tiny-GQA", t_len, 2, 6)), axis=-2)
    assert k.shape == (2, 2, t_len, 8) and k.dtype == np.float32
    assert np.array_equal(cache.k_cache[..., :t_len, :], k)  # exact: a copy of the same float32 values
    assert np.all(np.abs(k) <= 1) and len(np.unique(k)) > 200  # int8 / 128, and not constant
    assert expected.shape == (2, 1, 32)


@pytest.mark.parametrize("shape", list(TINY))
@pytest.mark.parametrize("path", bench_roofline.ROOFLINE_PATHS)
def test_the_public_step_passes_its_check_and_leaves_the_cache_at_t(one_thread, tiny_shapes, shape, path):
    step, cache = answer.verified_step(shape, 600, 2, path)
    _, expected = answer.filled_cache(shape, 600, 2)
    out = step()
    assert cache.get_seq_length() == 600 and not cache.k_cache[..., 600, :].any()  # cropped back, zeroed
    np.testing.assert_allclose(out, expected, rtol=answer.RTOL, atol=answer.ATOL)


def test_a_wrong_step_fails_and_a_library_without_cached_decode_skips(one_thread, tiny_shapes, monkeypatch):
    right = kv.multi_head_decode
    monkeypatch.setattr(kv, "multi_head_decode", functools.wraps(right)(lambda *a, **k: right(*a, **k) * 1.01))
    with pytest.raises(AssertionError, match="roofline grouped Tiny-GQA at T=600, B=2"):
        answer.verified_step("Tiny-GQA", 600, 2, "grouped")
    monkeypatch.setattr(kv, "multi_head_decode", lambda x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, path: x)
    with pytest.raises(NotImplementedError, match="takes no cache"):
        answer.verified_step("Tiny-GQA", 600, 2, "grouped")
    monkeypatch.setattr(kv, "multi_head_decode", right)
    monkeypatch.delattr(kv, "MODEL_SHAPES")
    with pytest.raises(NotImplementedError, match="no MODEL_SHAPES"):
        answer.verified_step("Tiny-GQA", 600, 2, "grouped")


class SmallRoofline(answer.Roofline):
    params = [["Tiny-GQA"], [600], [1, 2], bench_roofline.ROOFLINE_PATHS]


def fixed_times(monkeypatch, seconds):
    """Sides whose every sample takes ``seconds[call]``: nothing is timed."""
    monkeypatch.setattr(pairs, "local_side", lambda call, number=1, clock=None: lambda n: [seconds[call]] * n)


def test_the_fraction_is_read_time_over_step_time_with_both_rates(monkeypatch):
    warm = []
    step, read = (lambda: warm.append("step")), (lambda: warm.append("read"))
    fixed_times(monkeypatch, {step: 0.04, read: 0.01})
    measured = answer.bandwidth_fraction(step, read, 2 * 10**8, seconds=0, min_pairs=7)
    assert warm == ["step", "read"]  # one warm-up call each, outside the timing
    assert measured["pairs"] == 7 and measured["burst"] == 1
    assert (measured["ratio"], measured["low"], measured["high"]) == pytest.approx((0.25, 0.25, 0.25))
    assert measured["step_gbps"] == pytest.approx(5.0) and measured["read_gbps"] == pytest.approx(20.0)


@pytest.mark.usefixtures("tiny_shapes")
def test_the_read_kernel_reads_the_weights_the_cache_and_a_buffer_of_the_copies(one_thread):
    for path in bench_roofline.ROOFLINE_PATHS:
        _, cache = answer.verified_step("Tiny-GQA", 600, 2, path)
        read, nbytes = answer.read_kernel("Tiny-GQA", 600, 2, path, cache)
        squares = read()  # each buffer's dot with itself: its sum of squares
        weights = answer.layer_weights("Tiny-GQA")
        expected = [float(np.sum(a.astype(np.float64) ** 2)) for a in (*weights, cache.k_cache, cache.v_cache)]
        np.testing.assert_allclose([float(s) for s in squares[:6]], expected, rtol=1e-4)  # float32 dots
        copies = 2 * 2 * 4 * 601 * 8 * 4 if path == "repeat_kv" else 0  # K and V for 4 query heads, [2, 4, 601, 8]
        assert nbytes == sum(a.nbytes for a in weights) + 2 * cache.k_cache.nbytes + copies
        assert len(squares) == 6 + bool(copies) and (not copies or squares[6] == copies // 4)  # a buffer of ones


@pytest.mark.usefixtures("tiny_shapes")
def test_setup_cache_measures_every_point_and_the_tracked_values_replay_it(one_thread, monkeypatch):
    monkeypatch.setattr(answer, "bandwidth_fraction",
                        lambda step, read, nbytes, seconds, min_pairs: {"ratio": 0.5, "low": 0.4, "high": 0.6,
                                                                        "pairs": min_pairs, "burst": 1,
                                                                        "bytes": nbytes, "step_gbps": 1.0,
                                                                        "read_gbps": 2.0})
    measured = SmallRoofline().setup_cache()
    assert set(measured) == {("Tiny-GQA", 600, b, p) for b in (1, 2) for p in bench_roofline.ROOFLINE_PATHS}
    point = ("Tiny-GQA", 600, 2, "repeat_kv")
    assert measured[point]["verified"] == ["roofline repeat_kv Tiny-GQA at T=600, B=2"]
    bench = SmallRoofline()
    bench.setup(measured, *point)
    assert [bench.track_ratio(measured, *point), bench.track_ratio_low(measured, *point),
            bench.track_ratio_high(measured, *point), bench.track_step_gbps(measured, *point),
            bench.track_read_gbps(measured, *point)] == [0.5, 0.4, 0.6, 1.0, 2.0]
    assert measured[point]["value"]["bytes"] == bench_roofline.step_bytes(*point)


@pytest.mark.usefixtures("tiny_shapes")
def test_a_point_left_out_skips_saying_why_and_a_wrong_step_fails(one_thread, monkeypatch):
    monkeypatch.setattr(answer, "not_measured", lambda shape, t, b, path: "too large" if b == 2 else None)
    right = kv.multi_head_decode
    monkeypatch.setattr(kv, "multi_head_decode", functools.wraps(right)(
        lambda *a, path, **k: right(*a, path=path, **k) * (1.01 if path == "repeat_kv" else 1)))
    monkeypatch.setattr(answer, "bandwidth_fraction", lambda *a: {"ratio": 0.5})
    measured = SmallRoofline().setup_cache()
    with pytest.raises(NotImplementedError, match="too large"):
        SmallRoofline().setup(measured, "Tiny-GQA", 600, 2, "grouped")
    with pytest.raises(AssertionError, match="roofline repeat_kv Tiny-GQA at T=600, B=1"):
        SmallRoofline().setup(measured, "Tiny-GQA", 600, 1, "repeat_kv")
    assert measured[("Tiny-GQA", 600, 1, "grouped")]["value"] == {"ratio": 0.5}


def test_the_real_points_fit_in_two_gib_by_their_arrays():
    """Each measured point's largest moment: the weights, the cache and the fill's chunk, or for repeat_kv the
    cache, the step's copies and the read kernel's buffer of their size (array shapes, float32)."""
    for shape, (n_heads, n_kv_heads) in {"Llama-3-8B": (32, 8), "Llama-2-7B": (32, 32)}.items():
        weights = 4 * 4096 * 128 * (2 * n_heads + 2 * n_kv_heads)
        for t_len in bench_roofline.ROOFLINE_LENGTHS:
            for batch in bench_roofline.ROOFLINE_BATCHES:
                for path in bench_roofline.ROOFLINE_PATHS:
                    if answer.not_measured(shape, t_len, batch, path):
                        continue
                    cache = 2 * 4 * batch * n_kv_heads * (t_len + 1) * 128
                    copied = path == "repeat_kv" and n_heads > n_kv_heads
                    copies = 2 * 4 * batch * n_heads * (t_len + 1) * 128 if copied else 0
                    assert weights + cache + 2 * copies <= 2 * 2**30, (shape, t_len, batch, path)


def test_the_tracked_values_have_units_and_versions():
    versions = {"track_step_gbps": "1", "track_read_gbps": "2", "track_ratio": "2", "track_ratio_low": "2",
                "track_ratio_high": "2"}  # 2: the read kernel became np.vdot
    for name, version in versions.items():
        listed = asv_listing("answers")[f"bench_roofline.Roofline.{name}"]
        assert listed["unit"] == ("GB/s" if name.endswith("gbps") else "ratio") and listed["version"] == version, name
    assert np.dtype(np.float32).itemsize == bench_roofline.ITEMSIZE
