"""The seeded problem factory.

Its arrays are default_rng's draws, the weights scaled, then cast: the same seed and sizes run the same
computation, so x and the embedding (unscaled draws) and a repeated problem are compared bit for bit.
"""

import numpy as np
import pytest

import kv_attention as kv


def test_default_problem_is_the_labs_shape_and_dtype():
    p = kv.make_problem(16)
    assert p.x.shape == (16, 64)
    assert [w.shape for w in (p.w_q, p.w_k, p.w_v)] == [(64, 64)] * 3
    assert all(a.dtype == np.float64 for a in p.args())


def test_same_seed_same_problem_other_seed_other_problem():
    a, b, c = kv.make_problem(8, 2), kv.make_problem(8, 2), kv.make_problem(8, 2, seed=7)
    for left, right in zip(a.args(), b.args()):
        np.testing.assert_array_equal(left, right)
    assert not np.array_equal(a.x, c.x)


def test_draws_come_from_default_rng_in_order_x_wq_wk_wv():
    rng = np.random.default_rng(42)
    x = rng.standard_normal((3, 5, 4))
    w_q = rng.standard_normal((4, 2)) / 2.0  # variance 1 / D_model
    p = kv.make_problem(5, 3, d_model=4, d_k=2, d_v=6)
    np.testing.assert_array_equal(p.x, x)
    np.testing.assert_allclose(p.w_q, w_q, rtol=1e-15)
    assert p.w_v.shape == (4, 6)


def test_float32_problem():
    assert all(a.dtype == np.float32 for a in kv.make_problem(4, dtype=np.float32).args())


def test_problem_factory_checks_its_arguments():
    with pytest.raises(ValueError, match="seq_len must be >= 0"):
        kv.make_problem(-1)
    with pytest.raises(ValueError, match="d_k must be >= 1"):
        kv.make_problem(4, d_k=0)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        kv.make_problem(4, batch_size=2.5)
    with pytest.raises(TypeError, match="float32 or float64"):
        kv.make_problem(4, dtype=np.int32)


@pytest.mark.parametrize(
    "seed, error, message",
    [
        (-1, ValueError, r"^seed must be >= 0, got -1$"),
        (True, TypeError, r"^seed must be an integer, got True$"),
        (None, TypeError, r"^seed must be an integer, got None$"),  # default_rng(None) would draw afresh each call
        (1.5, TypeError, r"^seed must be an integer, got 1.5$"),
    ],
)
def test_the_seed_is_an_integer_at_least_0(seed, error, message):
    with pytest.raises(error, match=message):
        kv.make_problem(2, seed=seed)


def test_an_integer_seed_of_numpy_draws_the_problem_of_that_seed():
    # x is default_rng(7)'s first draw, copied (float64 to float64): exact by construction.
    expected = np.random.default_rng(7).standard_normal((3, 64))
    np.testing.assert_array_equal(kv.make_problem(3, seed=np.int64(7)).x, expected)


def test_the_embedding_is_drawn_after_the_weights_so_nothing_else_changes():
    shape = {"d_model": 4, "d_k": 4, "d_v": 4}
    plain, with_vocab = kv.make_problem(5, 2, **shape), kv.make_problem(5, 2, **shape, vocab_size=7)
    for a, b in zip(plain.args(), with_vocab.args()):
        np.testing.assert_array_equal(a, b)
    assert plain.embedding is None
    rng = np.random.default_rng(42)
    rng.standard_normal((2, 5, 4))
    for d in (4, 4, 4):
        rng.standard_normal((4, d))
    np.testing.assert_array_equal(with_vocab.embedding, rng.standard_normal((7, 4)))
    assert kv.make_problem(3, vocab_size=2, dtype=np.float32).embedding.dtype == np.float32
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        kv.make_problem(3, vocab_size=0)


def test_repr_gives_shapes_and_dtype_not_the_arrays():
    assert repr(kv.make_problem(4096, 2)) == "Problem(x=[2, 4096, 64], w_q=[64, 64], w_k=[64, 64], w_v=[64, 64], dtype=float64)"
    p = kv.make_problem(3, d_model=4, d_k=2, d_v=5, dtype=np.float32)
    mixed = kv.Problem(p.x, p.w_q, p.w_k, p.w_v.astype(np.float64))
    assert repr(mixed) == "Problem(x=float32[3, 4], w_q=float32[4, 2], w_k=float32[4, 2], w_v=float64[4, 5])"
    with_vocab = kv.make_problem(3, d_model=4, d_k=2, d_v=5, vocab_size=100)
    assert repr(with_vocab) == "Problem(x=[3, 4], w_q=[4, 2], w_k=[4, 2], w_v=[4, 5], embedding=[100, 4], dtype=float64)"


def test_a_problem_of_dtype_none_is_refused():
    with pytest.raises(TypeError, match="^dtype must be float32 or float64, got None$"):
        kv.make_problem(4, dtype=None)
