"""Every recorded timing sample as one CSV row, the lab's ``benchmark.csv`` for any number of commits.

asv keeps the samples only when it ran with ``--record-samples`` (the main job
does). For a point without samples the rows hold the statistics asv did keep
(median, quartiles, 99 % confidence bounds), named in the ``statistic`` column.
Seconds are written with Python's float repr, so they read back bit for bit.

T and B are the values a benchmark ran with: its parameters, or the fixed
values of the suite in this working tree (B = 2 for the batch experiment,
T = 128 for the batch-size sweep); B is blank for the single-sequence cache
experiment.
"""

import csv
import sys

from benchmarks.common import BATCH, SWEEP_LENGTH

from .. import paths
from ..results import is_number
from . import EXPERIMENTS
from .tables import BATCH_BENCHMARK, SWEEP_BENCHMARK

COLUMNS = ["commit", "machine", "benchmark", "experiment", "strategy", "T", "B",
           "sample", "seconds", "statistic", "params", "env"]
FIXED = {BATCH_BENCHMARK: {"B": BATCH}, SWEEP_BENCHMARK: {"T": SWEEP_LENGTH, "strategy": "batched"}}
STATISTICS = ("q_25", "q_75", "ci_99_a", "ci_99_b")


def _experiment(benchmark):
    named = [name for name, timing in EXPERIMENTS.items() if timing == benchmark]
    return named[0] if named else benchmark.split(".")[0].removeprefix("bench_")


def point_rows(run, point):
    """The CSV rows of one point: one per sample, else one per kept statistic; none if it did not run."""
    if not is_number(point.value):
        return []
    params = FIXED.get(point.benchmark, {}) | point.params
    rest = " ".join(f"{k}={v}" for k, v in point.params.items() if k not in ("strategy", "T", "B"))
    head = [run.commit, run.machine, point.benchmark, _experiment(point.benchmark),
            params.get("strategy", ""), params.get("T", ""), params.get("B", "")]
    if point.samples:
        return [head + [i, s, "sample", rest, run.env_name] for i, s in enumerate(point.samples)]
    kept = [("median", point.value)] + [(k, point.stats[k]) for k in STATISTICS if k in point.stats]
    return [head + ["", v, name, rest, run.env_name] for name, v in kept]


def _write_rows(results, files, f, progress):
    counts = {"rows": 0, "runs": len(files), "points": 0, "points_without_samples": 0}
    show = progress is not None and progress.isatty() and len(files) > 20
    writer = csv.writer(f)
    writer.writerow(COLUMNS)
    for i, (machine, name) in enumerate(files, 1):
        if show:
            progress.write(f"\rreading result files: {i}/{len(files)}")
        run = results.load_file(machine, name)
        for point in run.points.values():
            if point.benchmark.rsplit(".", 1)[-1].startswith("time_"):
                rows = point_rows(run, point)
                counts["points"] += bool(rows)
                counts["points_without_samples"] += bool(rows) and not point.samples
                writer.writerows(rows)
                counts["rows"] += len(rows)
    if show:
        progress.write("\n")
    return counts


def write_csv(results, out, machine=None, env=None, progress=None):
    """Write the samples of every commit (of ``machine`` or every machine; ``env`` filters) to ``out``.

    Only ``time_`` benchmarks have samples (seconds). ``out`` "-" is stdout;
    a file must be one :func:`tools.paths.check_file` allows (never inside
    ``.asv/`` or the results directory, never a tracked file, a device or a
    FIFO) and is written whole or not at all. Returns a dict of counts: rows,
    runs, points, points_without_samples, and ``replaced`` (a file was there).

    Raises:
        UserError: ``out`` may not or cannot be written.
    """
    progress = sys.stderr if progress is None else progress
    files = [(m, n) for m in ([machine] if machine else results.machines) for n in results.files(m, env)]
    if out == "-":
        return _write_rows(results, files, sys.stdout, progress)
    target, replaced = paths.check_file(out, protected=results.paths)
    with paths.atomic_write(target) as f:
        counts = _write_rows(results, files, f, progress)
    return {**counts, "replaced": replaced}
