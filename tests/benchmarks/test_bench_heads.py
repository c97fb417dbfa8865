"""HeadsDecode: every point checked once in setup_cache, the checked decode's peak bytes, setup replaying both."""

import pytest

import kv_attention as kv
from benchmarks import bench_heads, heads_inputs


class SmallHeadsDecode(bench_heads.HeadsDecode):
    params = [["mha", "gqa"], [9], heads_inputs.HEADS_PATHS]


def test_setup_cache_checks_each_point_and_traces_its_decode(one_thread):
    checked = SmallHeadsDecode().setup_cache()
    assert set(checked) == {(kind, 9, path) for kind in ("mha", "gqa") for path in heads_inputs.HEADS_PATHS}
    for (kind, t_len, path), outcome in checked.items():
        assert outcome["verified"] == [f"{path} {kind} at T={t_len}"]
        n_kv_heads = heads_inputs.KINDS[kind]
        cache = 2 * 4 * n_kv_heads * t_len * 16 * 8  # K and V, [4, H_kv, T, 16] float64
        output = 4 * t_len * 128 * 8  # [4, T, 128]
        assert cache + output <= outcome["value"] < 50 * (cache + output)
    # repeat_kv copies K and V to all 8 query heads at the last step: [4, 8, 9, 16] each, 2 x 36864 bytes.
    copies = 2 * 4 * 8 * 9 * 16 * 8
    assert checked[("gqa", 9, "repeat_kv")]["value"] - checked[("gqa", 9, "grouped")]["value"] >= 0.75 * copies


def test_setup_replays_the_check_without_running_the_oracle_again(one_thread, monkeypatch):
    checked = SmallHeadsDecode().setup_cache()
    heads_inputs.heads_expected.cache_clear()
    monkeypatch.setattr(heads_inputs, "heads_oracle", lambda *a, **k: pytest.fail("the oracle ran again"))
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
