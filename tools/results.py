"""The one reader of asv's result files (``<results_dir>/<machine>/<hash8>-<env_name>.json``), as plain JSON.

A *point* is one benchmark at one parameter combination, labelled as ``asv compare`` labels it
(``name(16, 'concat')``); asv stores its value as a number, None (failed) or NaN (skipped: NotImplementedError).
"""

import ast
import contextlib
import datetime
import itertools
import json
import math
import os
import re
import stat
import subprocess
from dataclasses import dataclass, field

from . import common, paths
from .common import UserError


def results_dir():
    conf = json.loads((common.ROOT / "asv.conf.json").read_text())
    return common.ROOT / conf.get("results_dir", "results")


def suite():
    """asv's ``benchmarks.json`` (the suite it discovered last): ``{name: info}``, ``{}`` before the first run."""
    try:
        data = json.loads((results_dir() / "benchmarks.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def files(machine, commit, answers=False):
    """``commit``'s result files on ``machine``: the regression suite's, or the answers suite's (``.asv/answers``)."""
    folder = common.ROOT / ".asv" / "answers" if answers else results_dir()
    return sorted((folder / machine).glob(f"{commit[:8]}-*.json"))


def stored(machine, commit, answers=False):
    """``{label: Point}`` of every point asv stored for ``commit`` on ``machine`` (``{}`` if none)."""
    return {p.label: p for path in files(machine, commit, answers) for p in read_run(path, machine).points.values()}


def is_measured(value):
    return is_number(value) and not math.isnan(value)


def retired():
    """``{name: reason}``: ``RETIRED`` in the suite's benchmarks/common.py (a suite without it retired nothing)."""
    try:
        from benchmarks import common as bench_common
    except ImportError:
        return {}
    return dict(getattr(bench_common, "RETIRED", {}))


def vanished(base, head):
    """Sorted labels of the points measured at ``base`` that are n/a (NaN or not stored) at ``head``, but for those
    :func:`retired`; none where ``head`` has no results at all (a failed build, reported as such)."""
    if not head:
        return []
    retired_names = retired()
    return sorted(label for label, point in base.items()
                  if is_measured(point.value) and label not in retired_names and point.benchmark not in retired_names
                  and (head.get(label) is None or (is_number(head[label].value) and math.isnan(head[label].value))))


FAILED = "failed"  # asv stored null: setup (the correctness check) or the benchmark raised
SKIPPED = "n/a"  # asv stored NaN (NotImplementedError), or the commit has no such result
RESULT_FILE = re.compile(r"^[0-9a-f]{8}-.+\.json$")  # <hash8>-<env_name>.json


@dataclass(frozen=True)
class Point:
    """One benchmark at one parameter combination, ``value`` as asv stored it (a number, None or NaN); ``index``: the
    combination's (None without parameters)."""

    benchmark: str
    params: dict
    value: object
    stats: dict = field(default_factory=dict)
    samples: list = None
    label: str = ""
    index: int = None
    version: str = None


@dataclass
class Run:
    """One result file: a commit measured on a machine in one asv environment."""

    commit: str  # full hash
    machine: str
    env_name: str
    date: datetime.datetime  # the commit's date
    machine_params: dict  # asv's machine info plus the environment's requirements
    env_vars: dict
    points: dict  # (benchmark, tuple(sorted(params.items()))) -> Point
    measured: datetime.datetime = None  # when the run's last benchmark started

    def value(self, benchmark, **params):
        """The value of ``benchmark`` at ``params``: a number, FAILED, or SKIPPED (NaN, or the run lacks it)."""
        value = getattr(self.points.get((benchmark, tuple(sorted(params.items())))), "value", math.nan)
        return FAILED if value is None else SKIPPED if is_number(value) and math.isnan(value) else value


def is_number(x):
    """A real number (not a bool): what a table cell can compute with."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_json(path, what):
    """The JSON in ``path``, never opening a FIFO or device; UserError naming ``what`` if it cannot be read."""
    if os.path.exists(path) and not stat.S_ISREG(mode := os.stat(path).st_mode):
        raise UserError(f"cannot read {what}: it is {paths.kind(mode)}, not a regular file")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(f"cannot read {what}: {str(exc)[:200] or type(exc).__name__}") from None


def _utc(ms):
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def _param(text):
    """asv's repr of a parameter value -> the value: ``'16'`` -> 16, ``"'concat'"`` -> ``'concat'``."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, str) or is_number(value) and math.isfinite(value) else text  # OverflowError


class ResultsDir:
    """asv's results directory ``path`` for the report, parameter names from its ``benchmarks.json``; a run also holds
    its commit's answers where the answers suite stored them, in ``answers`` beside ``path`` (``.asv/answers``)."""

    def __init__(self, path, with_answers=True):
        answers, self.answers = os.path.join(os.path.dirname(os.path.abspath(path)), "answers"), None
        if with_answers and os.path.abspath(path) != answers and os.path.isdir(answers):
            with contextlib.suppress(UserError):  # none measured yet
                self.answers = ResultsDir(answers, False)
        if not os.path.isdir(path):
            raise UserError(f"no asv results directory at {path}: run the main job first (python3 tools/dev.py bench)")
        self.path = path
        self.machines = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n, "machine.json")))
        if not self.machines:
            raise UserError(f"{path} holds no machine's results: run the main job first")
        info = read_json(os.path.join(path, "benchmarks.json"), "benchmarks.json")
        if not isinstance(info, dict):
            raise UserError(f"cannot read benchmarks.json in {path}: not an object")
        self.param_names = {n: b.get("param_names") or [] for n, b in info.items() if isinstance(b, dict)}

    def pick_machine(self, machine=None):
        """The machine to report: ``machine`` if given, else this host's asv machine, else the only one."""
        here = common.machine_name() if common.machine_name() in self.machines else None
        machine = machine or here or (self.machines[0] if len(self.machines) == 1 else None)
        if machine is None:
            raise UserError(f"results from several machines in {self.path} ({', '.join(self.machines)}): "
                            "choose one with --machine")
        if machine not in self.machines:
            raise UserError(f"no results for machine {machine!r} in {self.path} (machines with results: "
                            f"{', '.join(self.machines)})")
        return machine

    def files(self, machine):
        """Result file names of ``machine``, sorted, regular files only."""
        folder = os.path.join(self.path, machine)
        return [n for n in sorted(os.listdir(folder)) if RESULT_FILE.match(n) and os.path.isfile(os.path.join(folder, n))]

    def load(self, machine, rev=None):
        """The run of ``rev`` on ``machine``: a git revision, else the start of a stored commit's hash; default:
        the newest commit (by commit date) with results."""
        names = self.files(machine)
        if rev is None and not names:
            raise UserError(f"no results for machine {machine!r} in {self.path}")
        if rev is None:
            commit = label = max((self.load_file(machine, n) for n in names), key=lambda r: r.date).commit
        else:
            git = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
                                 cwd=common.ROOT, capture_output=True, text=True)
            commit = git.stdout.strip() if git.returncode == 0 else rev.lower()
            label = rev if commit.startswith(rev.lower()) else f"{commit[:8]} ({rev})"
        names = [n for n in names if n.startswith(commit[:8])]
        if len(names) != 1:
            raise UserError(f"commit {label[:60]} matches several result files ({', '.join(names)}): name the "
                            "commit longer" if names else f"commit {label[:60]} has no results on machine {machine!r}")
        run = self.load_file(machine, names[0])
        if not run.commit.startswith(commit):
            raise UserError(f"commit {label[:60]} has no results on machine {machine!r}: {names[0]} holds {run.commit}")
        answers = [n for n in self.answers.files(machine) if n.startswith(run.commit[:8])] if (
            self.answers and machine in self.answers.machines) else []
        for name in answers[:1]:
            run.points.update(self.answers.load_file(machine, name).points)
        return run

    def load_file(self, machine, name):
        return read_run(os.path.join(self.path, machine, name), machine, self.param_names)


def read_run(path, machine, param_names=None):
    """One result file as a :class:`Run` (parameters named as ``param_names`` {benchmark: names} says, else
    ``param1``, ...); UserError naming the file if it is not one asv 0.6 writes."""
    name, label = os.path.basename(path), f"asv result file {machine}/{os.path.basename(path)}"
    data = read_json(path, label)
    try:
        if not name.startswith(data["commit_hash"][:8]):
            raise ValueError(f"commit_hash {data['commit_hash'][:40]} is not that of the file's name")
        run = Run(data["commit_hash"], machine, data["env_name"], _utc(data["date"]),
                  {str(k): str(v) for k, v in data["params"].items()},
                  {str(k): str(v) for k, v in (data.get("env_vars") or {}).items()}, {})
        started = []
        for benchmark, row in data["results"].items():  # a row: its columns as result_columns names them
            row = dict(zip(data["result_columns"], row))
            combos = list(itertools.product(*row["params"])) if row.get("params") else [None]
            started.append(row.get("started_at") or 0)
            names, width = (param_names or {}).get(benchmark, []), len(combos[0] or ())
            names = names if len(names) == width else [f"param{i + 1}" for i in range(width)]
            n, stats = len(combos), {k[6:]: v for k, v in row.items() if k.startswith("stats_") and v}
            for i, combo in enumerate(combos):
                value, samples = (row.get("result") or [None] * n)[i], (row.get("samples") or [None] * n)[i]
                params = {k: _param(str(v)) for k, v in zip(names, combo or ())}
                run.points[(benchmark, tuple(sorted(params.items())))] = Point(
                    benchmark, params, None if value is None else float(value),
                    {k: float(v[i]) for k, v in stats.items() if v[i] is not None},
                    None if samples is None else [float(x) for x in samples],
                    benchmark if combo is None else f"{benchmark}({', '.join(combo)})", None if combo is None else i,
                    row.get("version"))
        run.measured = _utc(max(started)) if any(started) else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, OSError) as exc:
        raise UserError(f"cannot read {label}: {str(exc)[:200] or type(exc).__name__}") from None
    return run
