"""What every benchmark shares: the timed problem, the oracle, the gate and the thread check.

These live in the suite, not in ``kv_attention``: asv takes the benchmarks from
the working tree but installs the package from the commit under test, so a
broken factory or reference in that commit can neither change the timed
problem nor pass its own gate.
"""

import functools
import math

import numpy as np

SEED = 42
D_MODEL = D_K = D_V = 64
LENGTHS = [16, 32, 64, 128, 256]  # T, the lab's sequence lengths
BATCH = 2  # B of the batch experiment
SWEEP_LENGTH = 128  # T of the batch-size sweep
SWEEP_BATCH_SIZES = [1, 2, 4, 8]

# Strategy name (asv parameter value) -> public function of kv_attention. Looked up
# by name rather than through kv_attention.STRATEGIES so that commits older than the
# registry stay benchmarkable and a wrong registry entry cannot redirect a benchmark.
PUBLIC_FUNCTIONS = {
    "no_cache": "decode_without_cache",
    "concat": "cached_attention",
    "preallocated": "cached_attention_preallocated",
    "sequential": "sequential_cached_attention",
    "batched": "batched_cached_attention",
}


@functools.lru_cache(maxsize=None)
def timed_inputs(t_len, batch=None):
    """The timed problem: ``(x, w_q, w_k, w_v)``, float64, read-only, identical for every commit.

    x: ``[T, 64]`` (batch None) or ``[B, T, 64]``, standard normal from
    ``default_rng(42)``; then w_q, w_k, w_v: ``[64, 64]``, normal with variance 1/64.
    """
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((t_len, D_MODEL) if batch is None else (batch, t_len, D_MODEL))
    weights = [rng.standard_normal((D_MODEL, d)) / math.sqrt(D_MODEL) for d in (D_K, D_K, D_V)]
    arrays = (x, *weights)
    for a in arrays:
        a.flags.writeable = False
    return arrays


def oracle(x, w_q, w_k, w_v):
    """Full causal attention written independently of kv_attention: ``[..., T, D_v]``."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = np.einsum("...td,...sd->...ts", q, k) / math.sqrt(q.shape[-1])  # [..., T, S]
    t_len = x.shape[-2]
    scores = np.where(np.tril(np.ones((t_len, t_len), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def library_function(name):
    """The commit's ``kv_attention.<name>``; NotImplementedError (asv skips) if it has none."""
    import kv_attention

    function = getattr(kv_attention, name, None)
    if function is None:
        raise NotImplementedError(f"kv_attention has no {name} at this commit")
    return function


def strategy_function(name):
    """The commit's public function for strategy ``name``; NotImplementedError (skip) if it has none."""
    return library_function(PUBLIC_FUNCTIONS[name])


def check_single_threaded():
    """Fail (AssertionError) unless every BLAS/OpenMP pool threadpoolctl sees runs one thread."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        raise AssertionError("threadpoolctl is missing: cannot verify the one-thread BLAS pin") from None
    pools = threadpool_info()
    unpinned = [f"{p['internal_api']}={p['num_threads']}" for p in pools if p["num_threads"] != 1]
    assert pools and not unpinned, (
        f"BLAS/OpenMP not pinned to one thread ({unpinned or 'no pool found'}); "
        "run through asv.conf.json's env_nobuild or set OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1"
    )


_PASSED = set()


def gate(name, t_len, batch=None):
    """The correctness gate run by every setup() before anything is timed.

    Checks the thread pin, runs the strategy once on the timed problem and
    compares it with :func:`oracle` (``assert_allclose``, atol=1e-8). Raises
    NotImplementedError when the commit lacks the strategy (asv skips) and
    AssertionError when it is wrong (asv fails the benchmark). A pass is
    remembered for the life of the benchmark process, since asv re-runs setup
    before every sample.

    Returns:
        The strategy's function, ready to be timed.
    """
    function = strategy_function(name)
    key = (name, t_len, batch)
    if key not in _PASSED:
        check_single_threaded()
        inputs = timed_inputs(t_len, batch)
        out = np.asarray(function(*inputs))
        expected = oracle(*inputs)
        assert out.dtype == np.float64, f"{name}: float64 inputs gave {out.dtype}"
        np.testing.assert_allclose(out, expected, atol=1e-8, err_msg=f"{name} at T={t_len}, B={batch}")
        _PASSED.add(key)
    return function
