"""The model's weight products ``x @ w.T`` and its BLAS thread count, each planned on the machine, as FFTW's wisdom.

:func:`linear` of ``x [..., in]`` and ``w [out, in]`` gives ``[..., out]`` in ``result_type(x, w)``, equal to
``x @ w.T`` within a float rounding. Its N rows, 1 to ``MAX_PLANNED``, take the formulation measured fastest for that
shape, dtype, N and thread count (which wins differs by BLAS kernel: docs/results.md#model); more rows, one product.
:func:`blas_threads` runs a call at the thread count measured fastest for a one-row step, unless the user chose
(:func:`set_threads`, OPENBLAS/OMP/MKL_NUM_THREADS, their own threadpoolctl limit). Each choice is measured once (a
few interleaved repeats, the median) and kept as FFTW keeps wisdom: in the process, and in
``$XDG_CACHE_HOME/kv_attention/plans.json`` (default ~/.cache) under a key naming the CPU model, the BLAS and NumPy's
version, since a plan holds on that machine only. A file that cannot be read or written is ignored.
"""

import contextlib
import functools
import json
import os
import platform
import re
import statistics
import tempfile
import time

import numpy as np
from threadpoolctl import ThreadpoolController

from ._validation import as_size

BLOCK_ROWS = 64  # a block read once serves every row (147 KB of a 576-column weight: it stays in L2)
MAX_PLANNED = 16  # a decode batch or a draft's verify; a prefill chunk's rows take one product
STREAM_BYTES = 64 << 20  # copies of a weight timed in turn: more than a last-level cache, as a step's weights are
REPEATS = 5  # interleaved timings of each candidate; the median decides
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_BLAS = ThreadpoolController().select(user_api="blas")
_DEFAULT = [c.num_threads for c in _BLAS.lib_controllers]  # the BLAS's counts before anyone limits them
_chosen = None  # set_threads' count
_in_call = None  # the BLAS thread count of the blas_threads call running now
_announce = None  # prepare's: called once before the first measurement


FORMULATIONS = {  # each writes rows [N, in] @ w.T into out [N, out]
    "one": lambda rows, w, out: np.matmul(rows, w.T, out=out),
    "blocks": lambda rows, w, out: [np.matmul(rows, w[i : i + BLOCK_ROWS].T, out=out[:, i : i + BLOCK_ROWS])
                                    for i in range(0, len(w), BLOCK_ROWS)],
    "per_row": lambda rows, w, out: [np.matmul(w, row, out=o) for row, o in zip(rows, out)],
}


def plan_path():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "kv_attention", "plans.json")


@functools.cache
def machine_key():
    """``'<CPU model>; <BLAS internal_api version architecture>...; numpy <version>'``: what a plan holds for."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"model name\s*:\s*(.*)", f.read()).group(1)
    except (OSError, AttributeError):
        cpu = platform.processor() or platform.machine()
    blas = [f"{i['internal_api']} {i.get('version')} {i.get('architecture')}" for i in _BLAS.info()]
    return "; ".join([cpu, *blas, f"numpy {np.__version__}"])


def _read():
    """The plan file's ``{machine key: {entry: choice}}``; {} where it is missing, unreadable or malformed."""
    try:
        with open(plan_path()) as f:
            plans = json.load(f)
    except (OSError, ValueError):
        return {}
    return plans if isinstance(plans, dict) and all(isinstance(p, dict) for p in plans.values()) else {}


@functools.cache
def _kept():
    """This process's plans: the file's for this machine, read once, and those measured since."""
    return dict(_read().get(machine_key(), {}))


def plan(entry, names, calls):
    """The name in ``names`` whose call (``calls()``: ``{name: zero-argument call}``) takes the least median time,
    measured once and kept under ``entry``, in the process and in the file."""
    global _announce
    if _kept().get(entry) in names:  # a name from another version or a corrupt file is measured again
        return _kept()[entry]
    if _announce is not None:
        _announce, announce = None, _announce
        announce()
    calls, times = calls(), {name: [] for name in names}
    for _ in range(REPEATS):  # interleaved: a slow spell of the machine falls on every candidate
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    best = _kept()[entry] = min(names, key=lambda name: statistics.median(times[name]))
    plans = _read()
    plans.setdefault(machine_key(), {})[entry] = best
    try:  # written whole, then renamed: a reader never sees half a file
        os.makedirs(os.path.dirname(plan_path()), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(plan_path()), delete=False) as f:
            json.dump(plans, f, indent=0)
        os.replace(f.name, plan_path())
    except OSError:
        pass
    return best


def _stream(rows, shape, dtype):
    """``(x [rows, in], copies of w [out, in], out [rows, out])``, the copies STREAM_BYTES together (at most 256)."""
    copies = max(1, min(256, STREAM_BYTES // (shape[0] * shape[1] * dtype.itemsize)))
    x, out = np.full((rows, shape[1]), 0.5, dtype), np.empty((rows, shape[0]), dtype)
    return x, np.full((copies, *shape), 0.5, dtype), out


@functools.cache
def choice(out, inner, dtype, rows, threads):
    """The formulation of ``rows`` rows times a weight ``[out, inner]`` of ``dtype`` at ``threads`` BLAS threads."""
    def calls():
        x, ws, y = _stream(rows, (out, inner), dtype)
        return {name: lambda f=f: [f(x, w, y) for w in ws] for name, f in FORMULATIONS.items()}

    return plan(f"{out}x{inner} {dtype} {rows} rows {threads} threads", list(FORMULATIONS), calls)


def _threads_now():
    return [c.num_threads for c in _BLAS.lib_controllers]


def threads():
    """The BLAS thread count :func:`blas_threads` sets: :func:`set_threads`' count; None (left as it is) where a
    variable or a caller's limit chose, or with one CPU or no BLAS; else the plan's: the fastest one-row product."""
    n = max(_DEFAULT, default=1)
    if _chosen is not None or _threads_now() != _DEFAULT or n == 1 or any(map(os.environ.get, THREAD_VARIABLES)):
        return _chosen

    def calls():
        x, ws, y = _stream(1, (1024, 1024), np.dtype(np.float32))
        return {str(i): functools.partial(_run, i, lambda: [np.matmul(x, w.T, out=y) for w in ws]) for i in counts}

    counts = range(1, n + 1)
    return int(plan(f"BLAS threads of {n}", [str(i) for i in counts], calls))


def set_threads(count):
    """Run :func:`blas_threads`' calls at ``count`` BLAS threads (an int >= 1), or None: the plan's, as at import."""
    global _chosen
    count = None if count is None else as_size("threads", count, minimum=1)
    if count is not None and count > (os.cpu_count() or 1):  # threads beyond the CPUs take turns on them
        raise ValueError(f"threads must be at most this machine's {os.cpu_count() or 1} CPUs, got {count}")
    _chosen = count


def _run(count, call):
    global _in_call
    outer = _in_call
    with contextlib.nullcontext() if count is None else _BLAS.limit(limits=count):
        _in_call = min(_threads_now(), default=1)  # read once a call, not once a product (1 us each)
        try:
            return call()
        finally:
            _in_call = outer


def blas_threads(function):
    """``function`` run at :func:`threads`' BLAS thread count (threadpoolctl's limit: 10-30 us a call)."""
    return functools.wraps(function)(lambda *args, **kwargs: _run(threads(), lambda: function(*args, **kwargs)))


def prepare(shapes, dtype, announce=None):
    """Measure now, not inside a timed call, every plan a model of weights ``shapes`` (``[(out, in), ...]``) of
    ``dtype`` needs: the thread count, each shape's formulation at 1 to MAX_PLANNED rows (about 20 s on a 2-core VM
    the first time, then read from the file); ``announce()`` first where any is measured."""
    global _announce
    _announce = announce
    try:
        _run(threads(), lambda: [choice(*shape, np.dtype(dtype), n, _in_call) for shape in dict.fromkeys(shapes)
                                 for n in range(1, MAX_PLANNED + 1)])
    finally:
        _announce = None


def linear(x, w):
    """``x @ w.T`` of ``x [..., in]`` and ``w [out, in]``: ``[..., out]``, in the planned formulation (module doc)."""
    rows = x.reshape(-1, x.shape[-1])  # [N, in]
    dtype, n = np.result_type(rows, w), len(rows)
    name = "one" if not 0 < n <= MAX_PLANNED else choice(*w.shape, dtype, n, _in_call or min(_threads_now(), default=1))
    if name == "one" or (name == "per_row" and n == 1):  # the same BLAS call as FORMULATIONS', without its loop
        out = rows @ w.T if name == "one" else np.matmul(w, rows[0])[None]  # [N, out]
    else:
        out = np.empty((n, len(w)), dtype)  # [N, out]
        FORMULATIONS[name](rows, w, out)
    return out.reshape(x.shape[:-1] + w.shape[:1])
