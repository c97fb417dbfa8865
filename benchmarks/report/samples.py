"""Every recorded timing sample as one CSV row, the lab's ``benchmark.csv`` for any number of commits.

asv keeps the samples only when it ran with ``--record-samples`` (the main job
does). For a point without samples the rows hold the statistics asv did keep
(median, quartiles, 99 % confidence bounds), named in the ``statistic`` column.
Seconds are written with Python's float repr, so they read back bit for bit.
"""

import csv
import os
import sys

from ..common import BATCH, SWEEP_LENGTH
from .results import load_run
from .tables import BATCH_BENCHMARK, CACHE_BENCHMARK, SWEEP_BENCHMARK

COLUMNS = ["commit", "machine", "benchmark", "experiment", "strategy", "T", "B",
           "sample", "seconds", "statistic", "params"]
EXPERIMENTS = {CACHE_BENCHMARK: "cache", BATCH_BENCHMARK: "batch", SWEEP_BENCHMARK: "batch_size"}
FIXED = {BATCH_BENCHMARK: {"B": BATCH}, SWEEP_BENCHMARK: {"T": SWEEP_LENGTH, "strategy": "batched"}}
STATISTICS = ("q_25", "q_75", "ci_99_a", "ci_99_b")


def _experiment(benchmark):
    module = benchmark.split(".")[0]
    return EXPERIMENTS.get(benchmark, module.removeprefix("bench_"))


def point_rows(run, point):
    """The CSV rows of one point: one per sample, else one per kept statistic; none if it did not run."""
    if not isinstance(point.value, float):
        return []
    params = FIXED.get(point.benchmark, {}) | point.params
    rest = " ".join(f"{k}={v}" for k, v in point.params.items() if k not in ("strategy", "T", "B"))
    head = [run.commit, run.machine, point.benchmark, _experiment(point.benchmark),
            params.get("strategy", ""), params.get("T", ""), params.get("B", "")]
    if point.samples:
        return [head + [i, s, "sample", rest] for i, s in enumerate(point.samples)]
    kept = [("median", point.value)] + [(k, point.stats[k]) for k in STATISTICS if k in point.stats]
    return [head + ["", v, name, rest] for name, v in kept]


def write_csv(results, out, machine=None, progress=sys.stderr):
    """Write the samples of every commit (of ``machine``, or of every machine) to ``out``.

    Only ``time_`` benchmarks have samples (seconds). Returns a dict of counts:
    rows, runs, points, points_without_samples.
    """
    paths = [os.path.join(results.path, m, n)
             for m in ([machine] if machine else results.machines) for n in results.files(m)]
    counts = {"rows": 0, "runs": len(paths), "points": 0, "points_without_samples": 0}
    show = progress is not None and progress.isatty() and len(paths) > 20
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for i, path in enumerate(paths, 1):
            if show:
                progress.write(f"\rreading result files: {i}/{len(paths)}")
            run = load_run(path, results.param_names)
            for point in run.points.values():
                if point.benchmark.split(".")[-1].startswith("time_"):
                    rows = point_rows(run, point)
                    counts["points"] += bool(rows)
                    counts["points_without_samples"] += bool(rows) and not point.samples
                    writer.writerows(rows)
                    counts["rows"] += len(rows)
    if show:
        progress.write("\n")
    return counts
