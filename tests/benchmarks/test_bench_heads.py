"""The heads benchmarks: the oracle, the checks and skips, every point checked once in setup_cache, and setup replaying it."""

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import bench_heads, common

from ..references import naive_multi_head


class SmallHeadsDecode(bench_heads.HeadsDecode):
    params = [["mha", "gqa"], [9], bench_heads.HEADS_PATHS]


def test_setup_cache_checks_each_point_and_traces_its_decode(one_thread):
    checked = SmallHeadsDecode().setup_cache()
    assert set(checked) == {(kind, 9, path) for kind in ("mha", "gqa") for path in bench_heads.HEADS_PATHS}
    for (kind, t_len, path), outcome in checked.items():
        assert outcome["verified"] == [f"{path} {kind} at T={t_len}"]
        n_kv_heads = bench_heads.KINDS[kind]
        cache = 2 * 4 * n_kv_heads * t_len * 16 * 8  # K and V, [4, H_kv, T, 16] float64
        output = 4 * t_len * 128 * 8  # [4, T, 128]
        assert cache + output <= outcome["value"] < 50 * (cache + output)
    # repeat_kv copies K and V to all 8 query heads at the last step: [4, 8, 9, 16] each, 2 x 36864 bytes.
    copies = 2 * 4 * 8 * 9 * 16 * 8
    assert checked[("gqa", 9, "repeat_kv")]["value"] - checked[("gqa", 9, "grouped")]["value"] >= 0.75 * copies


def test_setup_replays_the_check_without_running_the_oracle_again(one_thread, monkeypatch):
    checked = SmallHeadsDecode().setup_cache()
    bench_heads.heads_expected.cache_clear()
    monkeypatch.setattr(bench_heads, "heads_oracle", lambda *a, **k: pytest.fail("the oracle ran again"))
    bench = SmallHeadsDecode()
    bench.setup(checked, "gqa", 9, "grouped")
    assert bench.track_decode_peak_bytes(checked, "gqa", 9, "grouped") == checked[("gqa", 9, "grouped")]["value"]
    bench.time_decode(checked, "gqa", 9, "grouped")


def test_a_wrong_decode_fails_its_point_and_a_missing_one_skips(one_thread, monkeypatch):
    right = kv.multi_head_decode
    monkeypatch.setattr(kv, "multi_head_decode", lambda *a, **k: right(*a, **k) * (1 + 1e-6))
    checked = SmallHeadsDecode().setup_cache()
    with pytest.raises(AssertionError, match="grouped mha at T=9"):
        SmallHeadsDecode().setup(checked, "mha", 9, "grouped")
    monkeypatch.delattr(kv, "multi_head_decode")
    checked = SmallHeadsDecode().setup_cache()
    with pytest.raises(NotImplementedError, match="no multi_head_decode"):
        SmallHeadsDecode().setup(checked, "mha", 9, "grouped")


@pytest.mark.parametrize("kind", sorted(bench_heads.KINDS))
def test_oracle_matches_the_independent_per_head_reference(kind):
    inputs = bench_heads.heads_inputs(kind, 9)
    n_kv_heads = bench_heads.KINDS[kind]
    np.testing.assert_allclose(
        bench_heads.heads_oracle(*inputs, 8, n_kv_heads), naive_multi_head(*inputs, 8, n_kv_heads),
        rtol=1e-10, atol=1e-10,
    )


def test_timed_inputs_have_the_issues_shapes_and_are_read_only():
    x, w_q, w_k, w_v, w_o = bench_heads.heads_inputs("gqa", 64)
    shapes = [a.shape for a in (x, w_q, w_k, w_v, w_o)]
    assert shapes == [(4, 64, 128), (128, 128), (128, 32), (128, 32), (128, 128)]
    assert x.dtype == np.float64 and not any(a.flags.writeable for a in (x, w_q, w_k, w_v, w_o))
    np.testing.assert_array_equal(x, np.random.default_rng(42).standard_normal((4, 64, 128)))
    mqa = bench_heads.heads_inputs("mqa", 64)
    assert mqa[1] is not w_q and np.array_equal(mqa[1], w_q) and np.array_equal(mqa[4], w_o)  # shared draws
    assert mqa[2].shape == (128, 16)


@pytest.mark.parametrize("kind", sorted(bench_heads.KINDS))
@pytest.mark.parametrize("path", bench_heads.HEADS_PATHS)
def test_check_passes_the_correct_decode(one_thread, kind, path):
    decode = bench_heads.verified_heads_decode(kind, 16, path)
    assert decode.func is kv.multi_head_decode and decode.keywords["path"] == path
    assert decode.keywords["n_kv_heads"] == bench_heads.KINDS[kind]


def test_check_fails_the_wrong_head_mapping(one_thread, monkeypatch):
    # h % n_kv_heads instead of h // G: K/V columns permuted so that head h reads K/V head h % 2.
    def wrong(x, w_q, w_k, w_v, w_o, *, n_heads, n_kv_heads, path):
        out = np.empty(x.shape[:-1] + (w_q.shape[1],))
        for h in range(n_heads):
            q_cols, kv_cols = slice(16 * h, 16 * h + 16), slice(16 * (h % n_kv_heads), 16 * (h % n_kv_heads) + 16)
            out[..., q_cols] = common.oracle(x, w_q[:, q_cols], w_k[:, kv_cols], w_v[:, kv_cols])
        return out @ w_o

    monkeypatch.setattr(kv, "multi_head_decode", wrong)
    with pytest.raises(AssertionError, match="grouped gqa at T=16"):
        bench_heads.verified_heads_decode("gqa", 16, "grouped")


def test_checks_skip_what_the_commit_lacks(one_thread, monkeypatch):
    monkeypatch.delattr(kv, "multi_head_decode")
    monkeypatch.delattr(kv, "kv_cache_bytes")
    with pytest.raises(NotImplementedError, match="no multi_head_decode"):
        bench_heads.verified_heads_decode("mha", 16, "grouped")
    with pytest.raises(NotImplementedError, match="no kv_cache_bytes"):
        bench_heads.verified_cache_bytes("mha", 64)


def test_cache_bytes_check(monkeypatch):
    mib = 2**20
    assert [bench_heads.verified_cache_bytes(kind, 1024) for kind in ("mha", "gqa", "mqa")] == [8 * mib, 2 * mib, mib]
    monkeypatch.setattr(kv, "kv_cache_bytes", lambda **kw: 0)
    with pytest.raises(AssertionError, match="kv_cache_bytes for gqa at T=64: 0, expected"):
        bench_heads.verified_cache_bytes("gqa", 64)
