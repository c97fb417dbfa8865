"""Calls into kv_attention shared by the library's tests: a strategy by name, a ragged strategy's pool
options, multi-head attention, and the comparison of two floating-point results within a few ULPs.

Results computed through BLAS (matmul, einsum, a softmax of computed scores) differ in their last
bits from one OpenBLAS kernel to another (OPENBLAS_CORETYPE=Haswell, SkylakeX, ...): two different
computations of the same value are compared with :func:`assert_ulps_close`, never bit for bit. A test
compares bit for bit only what is exact by construction (a copy, a gather, integer data, the same
computation on the same inputs, a weight of exactly 0 or 1), and says why.
"""

import numpy as np

import kv_attention as kv

HEADS_PATHS = ("grouped", "repeat_kv")


def run(name, *args, **kwargs):
    return kv.STRATEGIES[name](*args, **kwargs)


def pool_options(strategy, block_size, num_blocks=None):
    """The pool's options for ``ragged_decode``: ``block_size`` (and ``num_blocks`` if given) for "paged", none
    for the other strategies, which have no pool and refuse them."""
    if strategy != "paged":
        return {}
    return {"block_size": block_size} if num_blocks is None else {"block_size": block_size, "num_blocks": num_blocks}


def heads_reference(*args, n_heads=6, n_kv_heads=2):
    return kv.multi_head_attention(*args, n_heads=n_heads, n_kv_heads=n_kv_heads)


def heads_decode(*args, n_heads=6, n_kv_heads=2, path="grouped", **kwargs):
    return kv.multi_head_decode(*args, n_heads=n_heads, n_kv_heads=n_kv_heads, path=path, **kwargs)


def assert_ulps_close(actual, desired, ulps=4):
    """``actual`` within ``ulps`` units in the last place (of ``desired``'s dtype) of ``desired``.

    rtol = ulps·eps of each entry, and atol = ulps·eps·max|desired| for entries near 0,
    where a sum that cancels keeps no relative precision.
    """
    eps = float(np.finfo(np.result_type(desired)).eps)
    scale = float(np.max(np.abs(desired), initial=0.0))
    np.testing.assert_allclose(actual, desired, rtol=ulps * eps, atol=ulps * eps * scale)


HEADS_FUNCTIONS = {
    "reference": heads_reference,
    "grouped": heads_decode,
    "repeat_kv": lambda *args, **kw: heads_decode(*args, path="repeat_kv", **kw),
}
