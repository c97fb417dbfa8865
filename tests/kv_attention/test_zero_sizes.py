"""Zero sizes: one rule for every entry point.

D_k >= 1 wherever there are queries and keys (a score needs a dot product, and
the scale is 1 / sqrt(D_k)); every other array size may be 0 — D_v, D_model, T,
B, S, a batch axis of a cache — and gives empty arrays of the right shape. A size
below its minimum is a ValueError naming the caller's own argument.
"""

import numpy as np
import pytest

import kv_attention as kv

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 3))  # [T, D_model]
EMBEDDING = rng.standard_normal((6, 3))  # [V, D_model]


def weights(d_model=3, d_k=2, d_v=0):
    return [rng.standard_normal((d_model, d)) for d in (d_k, d_k, d_v)]


W_NO_V = weights()  # D_v = 0
Q, K = rng.standard_normal((2, 1, 2)), rng.standard_normal((2, 3, 2))  # [B, T_q, D_k], [B, S, D_k]
V0 = np.zeros((2, 3, 0))  # [B, S, D_v = 0]
VALID = np.array([[True, False, True], [False, False, False]])


def serve(w):
    requests = [kv.Request("a", [1, 2, 3], 2), kv.Request("b", [1, 2, 4, 5], 3)]
    return kv.serve(requests, EMBEDDING, *w, block_size=2, num_blocks=4, max_num_batched_tokens=4)


D_V_ZERO = {  # entry point with D_v = 0 -> (its output, the shape it must have)
    "causal_attention": (lambda: kv.causal_attention(X, *W_NO_V), (4, 0)),
    "causal_attention window": (lambda: kv.causal_attention(X, *W_NO_V, window=2, n_sink=1), (4, 0)),
    **{name: (lambda f=f, batch=name in ("sequential", "batched"): f(X[None] if batch else X, *W_NO_V),
              (1, 4, 0) if name in ("sequential", "batched") else (4, 0)) for name, f in kv.STRATEGIES.items()},
    "chunked_attention": (lambda: kv.chunked_attention(X, *W_NO_V, chunk_size=3), (4, 0)),
    "chunked_attention window": (lambda: kv.chunked_attention(X, *W_NO_V, chunk_size=3, window=2), (4, 0)),
    "attend": (lambda: kv.attend(Q, K, V0), (2, 1, 0)),
    "masked_attend": (lambda: kv.masked_attend(Q, K, V0, VALID), (2, 1, 0)),
    "split_kv_attention": (lambda: kv.split_kv_attention(Q, K, V0, num_splits=2), (2, 1, 0)),
    "cascade_attention": (lambda: kv.cascade_attention(Q, K[0], V0[0], [K[0], K[1, :1]], [V0[0], V0[1, :1]]),
                          (2, 1, 0)),
    **{f"ragged_decode {s}": (lambda s=s: np.stack(kv.ragged_decode([X, X], *W_NO_V, strategy=s)), (2, 4, 0))
       for s in kv.RAGGED_STRATEGIES},
    "serve": (lambda: np.stack([serve(W_NO_V).outputs["a"], serve(W_NO_V).outputs["b"]]), (2, 2, 0)),
}


@pytest.mark.parametrize("name", D_V_ZERO)
def test_d_v_0_gives_empty_outputs_everywhere(name):
    compute, shape = D_V_ZERO[name]
    out = compute()
    assert out.shape == shape and out.dtype == np.float64


def test_d_v_0_caches_hold_their_keys():
    k = rng.standard_normal((1, 3, 2))  # [N, T_new, D_k]
    paged = kv.PagedKVCache(4, 2, 2, 0)
    paged.add_sequence("a")
    paged.update(["a"], k, np.zeros((1, 3, 0)))
    k_seq, v_seq, lengths = paged.gather(["a"])
    # A gather copies what was written: exact by construction.
    np.testing.assert_array_equal(k_seq[0, :3], k[0])
    assert v_seq.shape == (1, 4, 0) and lengths.tolist() == [3]
    for cache in (kv.StaticCache((1,), 4, 2, 0), kv.SlidingWindowCache((1,), 4, 2, 0)):
        keys, values = cache.update(k, np.zeros((1, 3, 0)))
        np.testing.assert_array_equal(keys, k)  # a copy
        assert values.shape == (1, 3, 0)


D_K_ZERO = {  # entry point with D_k = 0 -> the message, which names the caller's argument
    "causal_attention": (lambda: kv.causal_attention(X, *weights(d_k=0, d_v=2)),
                         r"D_k must be at least 1: w_q \(3, 0\)"),
    "chunked_attention": (lambda: kv.chunked_attention(X, *weights(d_k=0, d_v=2), chunk_size=2),
                          r"D_k must be at least 1: w_q \(3, 0\)"),
    "attend": (lambda: kv.attend(Q[..., :0], K[..., :0], V0), r"D_k must be at least 1: q \(2, 1, 0\)"),
    "cascade_attention": (lambda: kv.cascade_attention(Q[..., :0], K[0, :, :0], V0[0], [K[0, :, :0]] * 2, [V0[0]] * 2),
                          r"q must be \[B, T_q, D_k\] with D_k >= 1, got shape \(2, 1, 0\)"),
    "ragged_decode": (lambda: kv.ragged_decode([X], *weights(d_k=0, d_v=2), strategy="paged"),
                      r"D_k must be at least 1: w_q \(3, 0\)"),
    "serve": (lambda: serve(weights(d_k=0, d_v=2)), r"D_k must be at least 1: w_q \(3, 0\)"),
    "StaticCache": (lambda: kv.StaticCache((2,), 4, 0, 3), r"^k_dim must be >= 1, got 0$"),
    "SlidingWindowCache": (lambda: kv.SlidingWindowCache((2,), 4, 0, 3), r"^k_dim must be >= 1, got 0$"),
    "PagedKVCache": (lambda: kv.PagedKVCache(4, 2, 0, 3), r"^k_dim must be >= 1, got 0$"),
}


@pytest.mark.parametrize("name", D_K_ZERO)
def test_d_k_0_is_refused_naming_the_callers_argument(name):
    compute, message = D_K_ZERO[name]
    with pytest.raises(ValueError, match=message):
        compute()
