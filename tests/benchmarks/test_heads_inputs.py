"""The heads benchmarks' own machinery: their oracle, their correctness checks, and skips for what a commit lacks."""

import numpy as np
import pytest

import kv_attention as kv
from benchmarks import common, heads_inputs

from ..references import naive_multi_head


@pytest.mark.parametrize("kind", sorted(heads_inputs.KINDS))
def test_oracle_matches_the_independent_per_head_reference(kind):
    inputs = heads_inputs.heads_inputs(kind, 9)
    n_kv_heads = heads_inputs.KINDS[kind]
    np.testing.assert_allclose(
        heads_inputs.heads_oracle(*inputs, 8, n_kv_heads), naive_multi_head(*inputs, 8, n_kv_heads),
        rtol=1e-10, atol=1e-10,
    )


def test_timed_inputs_have_the_issues_shapes_and_are_read_only():
    x, w_q, w_k, w_v, w_o = heads_inputs.heads_inputs("gqa", 64)
    shapes = [a.shape for a in (x, w_q, w_k, w_v, w_o)]
    assert shapes == [(4, 64, 128), (128, 128), (128, 32), (128, 32), (128, 128)]
    assert x.dtype == np.float64 and not any(a.flags.writeable for a in (x, w_q, w_k, w_v, w_o))
    np.testing.assert_array_equal(x, np.random.default_rng(42).standard_normal((4, 64, 128)))
    mqa = heads_inputs.heads_inputs("mqa", 64)
    assert mqa[1] is not w_q and np.array_equal(mqa[1], w_q) and np.array_equal(mqa[4], w_o)  # shared draws
    assert mqa[2].shape == (128, 16)


@pytest.mark.parametrize("kind", sorted(heads_inputs.KINDS))
@pytest.mark.parametrize("path", heads_inputs.HEADS_PATHS)
def test_check_passes_the_correct_decode(one_thread, kind, path):
    decode = heads_inputs.verified_heads_decode(kind, 16, path)
    assert decode.func is kv.multi_head_decode and decode.keywords["path"] == path
    assert decode.keywords["n_kv_heads"] == heads_inputs.KINDS[kind]


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
        heads_inputs.verified_heads_decode("gqa", 16, "grouped")


def test_checks_skip_what_the_commit_lacks(one_thread, monkeypatch):
    monkeypatch.delattr(kv, "multi_head_decode")
    monkeypatch.delattr(kv, "kv_cache_bytes")
    with pytest.raises(NotImplementedError, match="no multi_head_decode"):
        heads_inputs.verified_heads_decode("mha", 16, "grouped")
    with pytest.raises(NotImplementedError, match="no kv_cache_bytes"):
        heads_inputs.verified_cache_bytes("mha", 64)


def test_cache_bytes_check(monkeypatch):
    mib = 2**20
    assert [heads_inputs.verified_cache_bytes(kind, 1024) for kind in ("mha", "gqa", "mqa")] == [8 * mib, 2 * mib, mib]
    monkeypatch.setattr(kv, "kv_cache_bytes", lambda **kw: 0)
    with pytest.raises(AssertionError, match="kv_cache_bytes for gqa at T=64: 0, expected"):
        heads_inputs.verified_cache_bytes("gqa", 64)
