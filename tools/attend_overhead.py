"""The public ``kv_attention.attend``'s cost over its core, paired: issue 21's measurement.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python tools/attend_overhead.py [--shape tiny|8b] [--package DIR]

The core is the bare NumPy computation, written here: scores matmul, scale, stable
softmax, output matmul. Each sample times an inner loop of calls (200 at ``tiny``,
q ``[1, 1, 8]`` against k, v ``[1, 4, 8]`` in float64; 1 at ``8b``, Llama-3-8B's
grouped step, q ``[1, 8, 4, 128]`` against a cache's K/V views at T = 16,384 in
float32); the core, the default call and the ``check_finite=False`` call (where the
package has the keyword) alternate sample by sample, and each call's ratio to the
core is the median of the per-sample ratios with its 95 % sign-test interval
(``benchmarks.pairs.median_interval``). ``--package DIR`` imports ``kv_attention``
from DIR, e.g. an older commit unpacked by ``git archive``.
"""

import argparse
import inspect
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"tiny": (200, 301), "8b": (1, 31)}  # shape -> (calls per sample, samples)


def inputs(shape, rng):
    """``(q, k, v)`` of ``shape``: the tiny problem, or Llama-3-8B's step against a StaticCache's views."""
    if shape == "tiny":
        return rng.standard_normal((1, 1, 8)), rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 4, 8))
    t_len = 16384
    q = rng.standard_normal((1, 8, 4, 128), dtype=np.float32)  # [B, H_kv, G, D_head]
    k, v = (np.zeros((1, 8, t_len + 1, 128), np.float32) for _ in range(2))  # a cache's buffers, one slot free
    k[..., :t_len, :] = rng.standard_normal((1, 8, t_len, 128), dtype=np.float32)
    v[..., :t_len, :] = rng.standard_normal((1, 8, t_len, 128), dtype=np.float32)
    return q, k[..., :t_len, :], v[..., :t_len, :]  # [B, H_kv, T, D_head] views, as the cache returns them


def core(q, k, v):
    """softmax(q kᵀ / sqrt(D)) v, bare."""
    scores = q @ k.swapaxes(-1, -2)
    scores *= 1.0 / math.sqrt(q.shape[-1])
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ v


def timed(call, inner):
    start = time.perf_counter()
    for _ in range(inner):
        call()
    return (time.perf_counter() - start) / inner


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    parser.add_argument("--package", type=Path, help="import kv_attention from this folder")
    parser.add_argument("--samples", type=int, help="samples per call (default: 301 tiny, 31 8b)")
    args = parser.parse_args(argv)
    if args.package is not None and not (args.package / "kv_attention" / "__init__.py").is_file():
        parser.error(f"--package {args.package}: no kv_attention/__init__.py there")
    if args.samples is not None and args.samples < 6:
        parser.error("--samples must be at least 6 (the fewest with a 95 % interval)")
    sys.path.insert(0, str(args.package or ROOT))
    sys.path.insert(1, str(ROOT))  # benchmarks.pairs, from this checkout
    import kv_attention as kv
    from benchmarks.pairs import median_interval

    inner, samples = SHAPES[args.shape]
    samples = args.samples or samples
    q, k, v = inputs(args.shape, np.random.default_rng(0))
    calls = {"core": lambda: core(q, k, v), "attend (default)": lambda: kv.attend(q, k, v)}
    if "check_finite" in inspect.signature(kv.attend).parameters:
        calls["attend (check_finite=False)"] = lambda: kv.attend(q, k, v, check_finite=False)
    tolerance = 1e-12 if q.dtype == np.float64 else 1e-5
    np.testing.assert_allclose(kv.attend(q, k, v), core(q, k, v), rtol=tolerance, atol=tolerance)
    names = list(calls)
    times = {name: [] for name in names}
    for call in calls.values():
        timed(call, inner)  # warm-up
    for i in range(samples):
        for name in names if i % 2 == 0 else names[::-1]:
            times[name].append(timed(calls[name], inner))
    print(f"kv_attention from {Path(kv.__file__).parent}")
    print(f"{args.shape}: q {q.shape}, k {k.shape}, {q.dtype}; {samples} samples of {inner} call(s), alternated")
    print(f"  core: median {np.median(times['core']) * 1e6:.2f} us")
    for name in names[1:]:
        median, low, high = median_interval([a / b for a, b in zip(times[name], times["core"])])
        print(f"  {name}: median {np.median(times[name]) * 1e6:.2f} us, over the core {median:.2f}x [{low:.2f}, {high:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
