"""Every recorded timing sample as one CSV row, the lab's ``benchmark.csv`` for any number of commits: seconds as
Python's float repr (read back bit for bit); T and B as the benchmark ran (its parameters, or the suite's fixed B = 2
of the batch experiment and T = 128 of the sweep). asv keeps samples only with ``--record-samples`` (the main job's).
"""

import contextlib
import csv
import sys

from benchmarks.common import BATCH, SWEEP_LENGTH

from .. import paths
from ..results import is_measured
from . import EXPERIMENTS
from .tables import BATCH_BENCHMARK, SWEEP_BENCHMARK

COLUMNS = ["commit", "machine", "benchmark", "experiment", "strategy", "T", "B", "sample", "seconds", "params", "env"]
FIXED = {BATCH_BENCHMARK: {"B": BATCH}, SWEEP_BENCHMARK: {"T": SWEEP_LENGTH, "strategy": "batched"}}


def _experiment(benchmark):
    named = [name for name, timing in EXPERIMENTS.items() if timing == benchmark]
    return named[0] if named else benchmark.split(".")[0].removeprefix("bench_")


def point_rows(run, point):
    """The CSV rows of one point: one per sample; none without samples or if it did not run."""
    if not is_measured(point.value) or not point.samples:
        return []
    params = FIXED.get(point.benchmark, {}) | point.params
    rest = " ".join(f"{k}={v}" for k, v in point.params.items() if k not in ("strategy", "T", "B"))
    head = [run.commit, run.machine, point.benchmark, _experiment(point.benchmark),
            params.get("strategy", ""), params.get("T", ""), params.get("B", "")]
    return [head + [i, s, rest, run.env_name] for i, s in enumerate(point.samples)]


def write_csv(results, out, machine):
    """Write the samples of every commit of ``machine`` to ``out`` ("-": stdout; else :mod:`tools.paths`): counts of
    rows, runs, points, points_without_samples."""
    target = None if out == "-" else paths.check_file(out)
    counts = {"rows": 0, "runs": 0, "points": 0, "points_without_samples": 0}
    with contextlib.nullcontext(sys.stdout) if target is None else paths.atomic_write(target) as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for name in results.files(machine):
            run = results.load_file(machine, name)
            counts["runs"] += 1
            for point in run.points.values():
                timed = point.benchmark.rsplit(".", 1)[-1].startswith("time_") and is_measured(point.value)
                rows = point_rows(run, point) if timed else []
                counts["points"] += bool(rows)
                counts["points_without_samples"] += timed and not point.samples
                counts["rows"] += len(rows)
                writer.writerows(rows)
    return counts
