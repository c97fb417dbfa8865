"""The roofline experiment's inputs: the bytes a step reads, the step oracle, the check, the points left out."""

import functools

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import roofline_inputs as ri
from tests.references import heads_problem, naive_multi_head

TINY = {"Tiny-GQA": kv.ModelShape(n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8),
        "Tiny-MHA": kv.ModelShape(n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8)}


@pytest.fixture
def tiny_shapes(monkeypatch):
    """MODEL_SHAPES holding two tiny shapes, and no input of an earlier test held."""
    monkeypatch.setattr(kv, "MODEL_SHAPES", TINY)
    for cached in (ri.layer_weights, ri.new_position):
        cached.cache_clear()
    ri._FILLED.clear()
    yield
    for cached in (ri.layer_weights, ri.new_position):
        cached.cache_clear()
    ri._FILLED.clear()


def nbytes(*shapes):
    """float32 bytes of arrays of these shapes."""
    return sum(4 * int(np.prod(shape)) for shape in shapes)


def test_the_bytes_of_a_step_are_its_weights_its_cache_and_repeat_kvs_copies():
    # Llama-3-8B: D_model 4096, 32 query heads, 8 K/V heads of 128; the 192 MiB at T = 4096, B = 1.
    weights = nbytes((4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096))
    kv_4096 = nbytes((1, 8, 4097, 128), (1, 8, 4097, 128))  # K and V of 4096 cached positions and the new one
    assert weights == 160 * 2**20
    assert ri.step_bytes("Llama-3-8B", 4096, 1, "grouped") == weights + kv_4096
    copies = nbytes((1, 32, 4097, 128), (1, 32, 4097, 128))  # repeat_kv: K and V for all 32 query heads
    assert ri.step_bytes("Llama-3-8B", 4096, 1, "repeat_kv") == weights + kv_4096 + copies
    # Llama-2-7B is MHA: repeat_kv uses the cache's views, no copies; the 768 MiB at T = 16384.
    mha = nbytes(*[(4096, 4096)] * 4, (1, 32, 16385, 128), (1, 32, 16385, 128))
    assert ri.step_bytes("Llama-2-7B", 16384, 1, "repeat_kv") == ri.step_bytes("Llama-2-7B", 16384, 1, "grouped") == mha
    assert 768 * 2**20 < mha < 769 * 2**20


def test_points_over_two_gib_or_over_4096_positions_are_left_out_with_the_reason():
    # Llama-2-7B at B = 4, T = 16384: K and V alone are 2 x 4 x 32 x 16385 x 128 x 4 bytes, over 2 GiB.
    assert nbytes((4, 32, 16385, 128)) * 2 > 2 * 2**30
    assert "over the experiment's 2 GiB" in ri.not_measured("Llama-2-7B", 16384, 4, "grouped")
    # Llama-3-8B repeat_kv at B = 4, T = 16384 copies 2 GiB per step.
    assert "over the experiment's 2 GiB" in ri.not_measured("Llama-3-8B", 16384, 4, "repeat_kv")
    assert "B = 1 only" in ri.not_measured("Llama-3-8B", 16384, 4, "grouped")
    assert "B x T = 16384 cached positions" in ri.not_measured("Llama-2-7B", 4096, 4, "grouped")
    measured = [(s, t, b, p) for s in ri.ROOFLINE_SHAPES for t in ri.ROOFLINE_LENGTHS for b in ri.ROOFLINE_BATCHES
                for p in ri.ROOFLINE_PATHS if ri.not_measured(s, t, b, p) is None]
    assert len(measured) == 16 and all(b == 1 or t == 1024 for _, t, b, _ in measured)


def test_the_step_oracle_is_the_last_position_of_causal_multi_head_attention():
    t_len, n_heads, n_kv_heads, head_dim = 11, 6, 2, 3
    x, w_q, w_k, w_v, w_o = heads_problem(t_len + 1, batch=2, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                          head_dim=head_dim)
    expected = naive_multi_head(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads)[:, t_len:]  # [2, 1, D_out]
    heads = (2, t_len, n_kv_heads, head_dim)
    k, v = ((x[:, :t_len] @ w).reshape(heads).transpose(0, 2, 1, 3) for w in (w_k, w_v))  # [2, H_kv, T, D_head]
    q, k_new, v_new = (x[:, t_len] @ w for w in (w_q, w_k, w_v))
    chunks = [slice(0, 4), slice(4, 9), slice(9, t_len)]  # chunks of any length, in order
    out = ri.step_oracle(q, k_new, v_new, [k[..., c, :] for c in chunks], [v[..., c, :] for c in chunks], w_o,
                         n_heads, n_kv_heads)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_the_cache_holds_t_positions_of_the_drawn_k_and_v_in_chunks(tiny_shapes):
    t_len = ri.CHUNK + 88  # two chunks, the second short
    cache, expected = ri.filled_cache("Tiny-GQA", t_len, 2)
    assert cache.get_seq_length() == t_len and cache.max_seq_len == t_len + 1
    k = np.concatenate(list(ri.kv_chunks("Tiny-GQA", t_len, 2, 6)), axis=-2)
    assert k.shape == (2, 2, t_len, 8) and k.dtype == np.float32
    assert np.array_equal(cache.k_cache[..., :t_len, :], k)  # exact: a copy of the same float32 values
    assert np.all(np.abs(k) <= 1) and len(np.unique(k)) > 200  # int8 / 128, and not constant
    assert expected.shape == (2, 1, 32)


@pytest.mark.parametrize("shape", list(TINY))
@pytest.mark.parametrize("path", ri.ROOFLINE_PATHS)
def test_the_public_step_passes_its_check_and_leaves_the_cache_at_t(one_thread, tiny_shapes, shape, path):
    step, cache = ri.verified_step(shape, 600, 2, path)
    _, expected = ri.filled_cache(shape, 600, 2)
    out = step()
    assert cache.get_seq_length() == 600 and not cache.k_cache[..., 600, :].any()  # cropped back, zeroed
    np.testing.assert_allclose(out, expected, rtol=ri.RTOL, atol=ri.ATOL)


def test_a_wrong_step_fails_and_a_library_without_cached_decode_skips(one_thread, tiny_shapes, monkeypatch):
    right = kv.multi_head_decode
    monkeypatch.setattr(kv, "multi_head_decode", functools.wraps(right)(lambda *a, **k: right(*a, **k) * 1.01))
    with pytest.raises(AssertionError, match="roofline grouped Tiny-GQA at T=600, B=2"):
        ri.verified_step("Tiny-GQA", 600, 2, "grouped")
    monkeypatch.setattr(kv, "multi_head_decode", lambda x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, path: x)
    with pytest.raises(NotImplementedError, match="takes no cache"):
        ri.verified_step("Tiny-GQA", 600, 2, "grouped")
    monkeypatch.setattr(kv, "multi_head_decode", right)
    monkeypatch.delattr(kv, "MODEL_SHAPES")
    with pytest.raises(NotImplementedError, match="no MODEL_SHAPES"):
        ri.verified_step("Tiny-GQA", 600, 2, "grouped")
