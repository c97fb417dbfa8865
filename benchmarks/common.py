"""What every benchmark shares: the strategy table, the timed problem, the oracle and the correctness check.

These live in the suite, not in ``kv_attention``: asv takes the benchmarks from
the working tree but installs the package from the commit under test, so a
broken factory or reference in that commit can neither change the timed
problem nor pass its own check. Like numpy's ``benchmarks/common.py``, what is
here must not change its numbers: append, do not edit.

Every ``setup()`` calls :func:`verified_decode` before anything is timed. It
checks the one-thread BLAS pin, runs the commit's decode once on the timed
problem and compares it with an oracle written here. The outcomes are asv's:
NotImplementedError when the commit lacks the function (asv skips the point,
n/a) and AssertionError when it is wrong (asv fails it). Where the check costs
more than the samples, the class's ``setup_cache`` checks every point once per
commit (:func:`check_points`) and ``setup()`` replays the outcome (:func:`replay`),
so no process asv starts for a sample runs the oracle again. It is the suite's one
check-once scheme, written once in :class:`Measured`: a class defines
``measure(*point)`` and asv's ``setup_cache`` runs it at every point. ``Counts``
(whose counting process returns its outcomes in the same form) uses it too.
"""

import functools
import inspect
import itertools
import math
import time

import numpy as np

try:  # asv skips a benchmark whose own function raises this; a plain NotImplementedError there fails it
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # outside asv's environments
    SkipNotImplemented = NotImplementedError

SEED = 42
D_MODEL = D_K = D_V = 64
LENGTHS = [16, 32, 64, 128, 256]  # T, the lab's sequence lengths
BATCH = 2  # B of the batch experiment
SWEEP_LENGTH = 128  # T of the batch-size sweep
SWEEP_BATCH_SIZES = [1, 2, 4, 8]

# The suite's one registry of what each experiment compares, independent of kv_attention's
# (see PUBLIC_FUNCTIONS). Experiment -> its strategies (asv parameter values, in the suite's
# order) -> what each runs in kv_attention: a public function's name, or for ragged the value
# of ragged_decode's strategy= option.
STRATEGIES = {
    "cache": {"no_cache": "decode_without_cache", "concat": "cached_attention",
              "preallocated": "cached_attention_preallocated"},
    "batch": {"sequential": "sequential_cached_attention", "batched": "batched_cached_attention"},
    "ragged": {"padded": "padded", "compacted": "compacted", "paged": "paged"},  # ragged_decode(strategy=...)
}
# The heads experiment's paths: multi_head_decode(path=...), the library's word and the asv
# parameter's ("path"), so the suite never calls a path a strategy.
HEADS_PATHS = ["repeat_kv", "grouped"]
# Strategy name -> public function, for the cache and batch experiments. Looked up by name
# rather than through kv_attention.STRATEGIES so that commits older than the registry stay
# benchmarkable and a wrong registry entry cannot redirect a benchmark.
PUBLIC_FUNCTIONS = {**STRATEGIES["cache"], **STRATEGIES["batch"]}

# Benchmarks removed on purpose: name (a benchmark, or one point ``name(params)`` as asv labels it)
# -> why. A point that had a value at BASE and is n/a at HEAD fails the gate and the main job
# (exit 2) unless its benchmark is here, so a strategy cannot disappear unnoticed.
RETIRED = {  # Llama-2-7B is MHA: its repeat_kv step copies nothing (the two paths' intervals overlap at 4fbab830)
    f"bench_roofline.Roofline.track_{track}('Llama-2-7B', {t}, {b}, 'repeat_kv')":
        "repeat_kv at G = 1 is the grouped step, so it is not measured twice"
    for track in ("ratio", "ratio_low", "ratio_high", "step_gbps", "read_gbps") for t, b in
    ((1024, 1), (1024, 4), (4096, 1), (16384, 1))}
RETIRED.update({  # values no commit can change; the report computes them (docs/benchmarking.md, "Cost per commit")
    **{f"bench_model.ModelBytes.track_{track}": "arithmetic from the configs (bench_model.weight_bytes, ...), "
       "not a measurement of the commit" for track in ("weight_bytes", "kv_bytes_per_token", "crossover_positions")},
    "bench_roofline.RooflineBytes.track_bytes_read": "arithmetic (bench_roofline.step_bytes), not a measurement"})
RETIRED.update({  # the lab's answers (their class -> tracked values beside the ratio and its interval) moved
    f"{answer}.track_{track}": "a lab's answer: the answers suite, answers/ (docs/benchmarking.md)"
    for answer, tracks in {
        "bench_cache.CacheRatios": (), "bench_checks.CheckFiniteRatios": (), "bench_heads.HeadsRatios": (),
        "bench_batch.BatchRatios": ("sequential_step", "batched_step", "saved_step", "saved_step_low",
                                    "saved_step_high"),
        "bench_batch.BatchSizeRatios": (), "bench_prefill.PrefillRatios": (), "bench_quantized.QuantizedRatios": (),
        "bench_quantized.FusedRatios": (), "bench_ragged.RaggedRatios": (), "bench_ragged.PagedStepRatios": (),
        "bench_split.SplitRatios": (), "bench_split.CascadeRatios": (), "bench_speculative.SpeculativeRatios": (),
        "bench_roofline.Roofline": ("step_gbps", "read_gbps"),
        "bench_model.ModelStep": ("step_gbps", "read_gbps", "token_seconds"),
        "bench_model.ModelBatch": ("positions_per_second",), "bench_model.ModelBatchBLAS": ()}.items()
    for track in ("ratio", "ratio_low", "ratio_high", *tracks)})


class Benchmark:
    """The suite's timing defaults, as numpy's ``benchmarks/common.py`` ``Benchmark``: a class sets its own to differ.

    7 rounds (processes, interleaved with another commit's where asv runs two) of one sample within about 0.01 s,
    after a 0.05 s warm-up: 7 samples a point, each from a process of its own. asv compare's Mann-Whitney test takes
    the samples as independent, and a process's samples are not: they share its moment's load and its memory layout
    (a slow process gave two slow samples). One sample a process makes them independent; 7 is the fewest with which
    the test can mark a row at asv's p < 0.002 (6 against 6 cannot). Every sample is the process's CPU time (asv's
    ``timer``, ``time.process_time``: BLAS runs one thread), so the time another job holds the core is not counted.
    asv reads ``rounds``, ``repeat``, ``warmup_time`` and ``timer`` for ``time_`` benchmarks only; ``timeout``
    (seconds, also a ``setup_cache``'s) for every kind.
    """

    rounds = 7
    repeat = 1
    warmup_time = 0.05
    timer = time.process_time
    timeout = 120


@functools.lru_cache(maxsize=None)
def timed_inputs(t_len, batch=None):
    """The timed problem: ``(x, w_q, w_k, w_v)``, float64, read-only, identical for every commit.

    x: ``[T, 64]`` (batch None) or ``[B, T, 64]``, standard normal from
    ``default_rng(42)``; then w_q, w_k, w_v: ``[64, 64]``, normal with variance 1/64.
    """
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((t_len, D_MODEL) if batch is None else (batch, t_len, D_MODEL))
    weights = [rng.standard_normal((D_MODEL, d)) / math.sqrt(D_MODEL) for d in (D_K, D_K, D_V)]
    return read_only(x, *weights)


def read_only(*arrays):
    """``arrays`` as a tuple, each marked read-only, so no benchmark can change the timed problem."""
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


def library_function(name, check_finite=False):
    """The commit's ``kv_attention.<name>``; NotImplementedError (asv skips) if it has none.

    The suite times and counts the mechanism, not the library's scans of every
    element: a function that takes ``check_finite`` (:func:`takes_check_finite`)
    comes with ``check_finite=False`` bound, unless ``check_finite`` is True (the
    library's default, as ``bench_checks`` measures it). A commit without the
    keyword gives the function itself, which runs its checks as it always did.
    """
    import kv_attention

    function = getattr(kv_attention, name, None)
    if function is None:
        raise NotImplementedError(f"kv_attention has no {name} at this commit")
    # a class (a cache) is constructed as it is, and a table (MODEL_SHAPES) read as it is
    if not check_finite and inspect.isfunction(function) and takes_check_finite(function):
        return functools.partial(function, check_finite=False)
    return function


@functools.lru_cache(maxsize=None)
def takes_check_finite(function):
    """Whether the commit's ``function`` (a function) has a ``check_finite`` keyword: read once per function."""
    return "check_finite" in inspect.signature(function).parameters


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


def assert_float64_close(out, expected, what, rtol=1e-7, atol=1e-8):
    """AssertionError unless ``out`` is float64 of ``expected``'s shape and close to it.

    ``out`` and ``expected`` are arrays, or lists of arrays compared pairwise
    (one per sequence, for ragged batches; ``what`` then names the sequence).
    """
    if isinstance(expected, list):
        assert len(out) == len(expected), f"{what}: {len(out)} outputs for {len(expected)} sequences"
        for b, (got, want) in enumerate(zip(out, expected)):
            assert_float64_close(got, want, f"{what}, sequence {b}", rtol, atol)
        return
    out = np.asarray(out)
    assert out.dtype == np.float64, f"{what}: float64 inputs gave {out.dtype}"
    assert out.shape == expected.shape, f"{what}: shape {out.shape}, expected {expected.shape}"
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol, err_msg=what)


VERIFIED = set()  # keys whose check passed in this benchmark process (or in its setup_cache, see check_points)


def verified_decode(key, decode, inputs, reference, rtol=1e-7, atol=1e-8):
    """The suite's correctness check: ``decode``, once it matched ``reference`` on ``inputs``.

    Checks the thread pin, runs ``decode(*inputs)`` and compares it with
    ``reference(*inputs)`` (:func:`assert_float64_close`); ``key`` names the
    point in the message. A pass is remembered for the life of the benchmark
    process, since asv re-runs setup before every sample.
    """
    if key not in VERIFIED:
        check_single_threaded()
        assert_float64_close(decode(*inputs), reference(*inputs), key, rtol, atol)
        VERIFIED.add(key)
    return decode


def verified_strategy(name, t_len, batch=None):
    """The cache or batch experiment's strategy ``name``, checked on ``timed_inputs(t_len, batch)``."""
    decode = library_function(PUBLIC_FUNCTIONS[name])
    return verified_decode(f"{name} at T={t_len}, B={batch}", decode, timed_inputs(t_len, batch), oracle)


def check_points(params, check):
    """Run ``check(*point)`` once for every combination of ``params``: for a class's ``setup_cache``.

    A class whose check is costly (an oracle per head at T = 1024) checks every
    point once, in asv's ``setup_cache`` process for the commit, rather than in
    every process asv starts for a sample or a tracked value. Returns
    ``{point: outcome}``: ``{"value": what check returned, "verified": the
    keys it added to VERIFIED}``, ``{"skipped": why}`` (NotImplementedError) or
    ``{"failed": why}`` (any other error). :func:`replay` gives it to ``setup()``.
    """
    outcomes = {}
    for point in itertools.product(*params):
        before = set(VERIFIED)
        try:
            value = check(*point)
            outcomes[point] = {"value": value, "verified": sorted(VERIFIED - before)}
        except NotImplementedError as error:
            outcomes[point] = {"skipped": str(error) or "not implemented at this commit"}
        except Exception as error:  # noqa: BLE001 (a wrong or broken decode fails its point only)
            outcomes[point] = {"failed": f"{type(error).__name__}: {error}"}
    return outcomes


def replay(outcomes, point):
    """In ``setup()``: the outcome of ``point`` in :func:`check_points`, as asv's outcome, and its value.

    Raises NotImplementedError (asv skips; only when setup raises it, never a
    benchmark function) or AssertionError (asv fails) as the check did; else
    marks its keys verified in this process, so the decode is not checked
    again, and returns the check's value.
    """
    outcome = outcomes.get(tuple(point), {"failed": f"{tuple(point)} was not checked"})
    if "skipped" in outcome:
        raise NotImplementedError(outcome["skipped"])
    if "failed" in outcome:
        raise AssertionError(outcome["failed"])
    VERIFIED.update(outcome.get("verified", ()))
    return outcome["value"]


class Measured(Benchmark):
    """Every point measured once per commit: ``setup_cache`` runs :meth:`measure` at each (:func:`check_points`),
    and ``setup`` replays the point's outcome into ``self.measured`` (:func:`replay`).

    asv keys a ``setup_cache`` by where its function is defined, module and line (asv issue 880), and runs it once
    per key: one inherited from here would serve every subclass the first one's values. So each subclass gets its
    own, at its own line: this function with ``__wrapped__`` set to the class, as ``functools.wraps`` would set it,
    through which ``inspect.getsourcelines`` (what asv reads) gives the class's line. A class that defines a
    ``setup_cache`` itself (to share one between classes) keeps it, and so do its subclasses.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        inherited = getattr(cls, "setup_cache", None)
        if inherited is None or getattr(inherited, "per_class", False):  # none yet, or a base class's own
            cls.setup_cache = per_class_setup_cache(cls)

    def measure(self, *point):
        """The point's value, after the experiment's correctness check; NotImplementedError skips the point."""
        raise NotImplementedError(f"{type(self).__name__} measures nothing")

    def setup(self, measured, *point):
        self.measured = replay(measured, point)


def per_class_setup_cache(cls):
    """``cls``'s ``setup_cache``: :meth:`Measured.measure` at every point, reported (``__wrapped__``) as defined at
    ``cls``'s own line, so that asv keys it by ``cls``."""

    def setup_cache(self):
        return check_points(self.params, self.measure)

    setup_cache.__module__, setup_cache.__qualname__ = cls.__module__, f"{cls.__qualname__}.setup_cache"
    setup_cache.__wrapped__, setup_cache.per_class = cls, True
    return setup_cache
