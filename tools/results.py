"""The one reader of asv's result files, as plain JSON: for the main job, the gate and bisect, and for the report.

asv stores one file per commit and environment, ``<results_dir>/<machine>/<hash8>-<env_name>.json``: ``results``
maps a benchmark to one row, whose columns ``result_columns`` names (``result``, ``params``, ``version``, ...,
``samples``). A *point* is one benchmark at one parameter combination, labelled as ``asv compare`` labels it
(``name(16, 'concat')``); its value is a number, None (failed: the correctness check or the benchmark raised) or NaN
(skipped: NotImplementedError).
"""

import ast
import functools
import itertools
import json
import math
import os
import re
import reprlib
import stat
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field

from . import common, paths
from .common import UserError


def _rows(data):
    """``(benchmark, its parameter combinations ([None] without parameters), {column: value})`` of each row."""
    for name, row in data["results"].items():
        row = dict(zip(data["result_columns"], row))
        params = row.get("params") or []
        yield name, list(itertools.product(*params)) if params else [None], row


# --- for the main job, the gate and bisect ------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """One stored point: benchmark ``name``, its parameter combination's ``index``, value, samples, version."""

    name: str
    index: object  # None for a benchmark without parameters
    value: object
    samples: list = None
    version: str = None


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


def files(machine, commit):
    return sorted((results_dir() / machine).glob(f"{commit[:8]}-*.json"))


def stored(machine, commit):
    """``{label: Stored}`` of every point asv stored for ``commit`` on ``machine`` (``{}`` if none)."""
    points = {}
    for path in files(machine, commit):
        for name, combos, row in _rows(json.loads(path.read_text())):
            values, samples = row.get("result") or [None] * len(combos), row.get("samples") or [None] * len(combos)
            for i, combo in enumerate(combos):
                label = f"{name}({', '.join(combo)})" if combo is not None else name
                points[label] = Stored(name, None if combo is None else i, values[i], samples[i], row.get("version"))
    return points


def is_measured(value):
    return is_number(value) and not math.isnan(value)


def complete(machine, commit, benchmarks):
    """Every benchmark of the suite stored for ``commit``, every measured timing with its samples."""
    points = stored(machine, commit)
    unsampled = any(p.name.rsplit(".", 1)[-1].startswith("time_") and is_measured(p.value) and p.samples is None
                    for p in points.values())
    return bool(points) and set(benchmarks) <= {p.name for p in points.values()} and not unsampled


def outcomes(points):
    """``(Counter of ok / failed / skipped points, sorted names of the failed benchmarks)``."""
    counts = Counter("failed" if p.value is None else "ok" if is_measured(p.value) else "skipped"
                     for p in points.values())
    return counts, sorted({p.name for p in points.values() if p.value is None})


RETIRE_HINT = ("note: a vanished benchmark removed on purpose passes once it is declared, with the reason, "
               "in RETIRED in benchmarks/common.py")


def retired():
    """``{name: reason}``: ``RETIRED`` in the suite's benchmarks/common.py (a suite without it retired nothing)."""
    try:
        from benchmarks import common as bench_common
    except ImportError:
        return {}
    return dict(getattr(bench_common, "RETIRED", {}))


def vanished(base, head, retired_names=None):
    """Sorted labels of the points measured at ``base`` (``{label: Stored}``) that are n/a at ``head``.

    n/a is NaN (a skip) or no stored point; a failure is no vanished point; a point whose benchmark or label is a
    key of ``retired_names`` (default :func:`retired`) was removed on purpose. No results at all at ``head`` is a
    commit that failed to build, reported as such.
    """
    if not head:
        return []
    retired_names = retired() if retired_names is None else retired_names
    return sorted(label for label, point in base.items()
                  if is_measured(point.value) and label not in retired_names and point.name not in retired_names
                  and (head.get(label) is None or (is_number(head[label].value) and math.isnan(head[label].value))))


def quarantine_unreadable(machine):
    """Move every result file of ``machine`` that is not a regular file or not readable JSON to ``.asv/corrupt/``.

    asv writes result files in place: a killed run leaves a truncated one, which asv can neither read nor save
    over, so its commit would never be measured again; a FIFO would block asv forever. Moved aside, the commit
    has no results and is measured again.
    """
    folder = results_dir() / machine
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        mode = os.stat(path).st_mode if os.path.exists(path) else stat.S_IFREG
        reason = None if stat.S_ISREG(mode) else f"{paths.kind(mode)}, not a regular file"
        if not reason and path.name != "machine.json":
            try:
                data = json.loads(path.read_text())
                if not isinstance(data["results"], dict) or not isinstance(data["result_columns"], list):
                    raise TypeError
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
                reason = f"not an asv result file: {type(error).__name__}"
        if reason:
            target = common.ROOT / ".asv" / "corrupt" / machine / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            for i in itertools.count(1):
                if not os.path.lexists(target):
                    break
                target = target.with_name(f"{path.name}.{i}")
            os.rename(path, target)
            print(f"moved unreadable result file {path.relative_to(common.ROOT)} to "
                  f"{target.relative_to(common.ROOT)} ({reason}): its commit is measured again", flush=True)


def forget(machine, commits, keep):
    """Remove, through asv's Results API, the stored benchmarks of ``commits`` for which ``keep(points)`` is
    False (``points``: ``{label: Stored}`` of that benchmark); a file left empty is removed. The number removed."""
    from asv.results import Results

    removed = 0
    for commit in commits:
        points = stored(machine, commit)
        for path in files(machine, commit):
            result = Results.load(str(path))
            drop = [n for n in result.get_all_result_keys()
                    if not keep({label: p for label, p in points.items() if p.name == n})]
            for name in drop:
                result.remove_result(name)
            if drop and not list(result.get_all_result_keys()):
                path.unlink()
            elif drop:
                result.save(str(results_dir()))
            removed += len(drop)
    return removed


# --- for the report: checked runs ---------------------------------------------------------------------
#
# What the report reads it checks: a value that is neither a number, null nor NaN, a time that is not positive and
# finite, or malformed samples or statistics make the file unreadable (one UserError line), never a figure.

FAILED = "failed"  # asv stored null: setup (the correctness check) or the benchmark raised
SKIPPED = "n/a"  # asv stored NaN (NotImplementedError), or the commit has no such result
RESULT_FILE = re.compile(r"^([0-9a-f]{8})-(.+)\.json$")  # <hash8>-<env_name>.json
NEVER = 253402300800000  # ms since the epoch of the year 10000
UNBOUNDED = {"ci_99_a": -math.inf, "ci_99_b": math.inf}  # asv's 99 % bounds of one sample (--quick): none


@dataclass(frozen=True)
class Point:
    """One benchmark at one parameter combination: ``params`` {name: value}, ``value`` a number (seconds for a
    timing) or FAILED / SKIPPED, asv's ``stats``, the timing ``samples`` (or None)."""

    benchmark: str
    params: dict
    value: object
    stats: dict = field(default_factory=dict)
    samples: list = None


@dataclass
class Run:
    """One result file: a commit measured on a machine in one asv environment."""

    commit: str  # full hash
    machine: str
    env_name: str
    date: int  # commit date, ms since the epoch (asv's convention)
    machine_params: dict  # asv's machine info plus the environment's requirements
    env_vars: dict
    points: dict  # (benchmark, tuple(sorted(params.items()))) -> Point
    measured: int = None  # when the run's last benchmark started, ms since the epoch

    def value(self, benchmark, **params):
        """The stored value of ``benchmark`` at ``params``; SKIPPED if the run lacks it."""
        point = self.points.get((benchmark, tuple(sorted(params.items()))))
        return SKIPPED if point is None else point.value


def is_number(x):
    """A real number (not a bool): what a table cell can compute with."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_finite(x):
    """A real number that converts to a finite float (an int of 10**400 does not)."""
    try:
        return is_number(x) and math.isfinite(x)
    except OverflowError:
        return False


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60
short = _REPR.repr  # a value's repr, at most about 60 characters (for one-line messages)


def read_json(path, what):
    """The JSON in ``path``, never opening a FIFO or device; UserError naming ``what`` if it cannot be read."""
    if os.path.exists(path) and not stat.S_ISREG(mode := os.stat(path).st_mode):
        raise UserError(f"cannot read {what}: it is {paths.kind(mode)}, not a regular file")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except RecursionError:
        raise UserError(f"cannot read {what}: nested too deeply") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {what}: {str(exc)[:200] or type(exc).__name__}") from None


def _git(repo_dir, *args):
    out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


class ResultsDir:
    """asv's results directory, ``<path>/<machine>/<hash8>-<env_name>.json``, for the report.

    Only the files of commits on ``branch``'s first-parent history (those asv's graphs show) are read unless a
    commit is named; the others are named in a note. ``known_param_names`` (benchmark -> param_names) stands in
    where asv's benchmarks.json is missing or does not fit.
    """

    def __init__(self, path, repo_dir=".", known_param_names=None, branch=common.BRANCH):
        if not os.path.isdir(path):
            raise UserError(f"no asv results directory at {path}: run the main job first (python3 tools/dev.py bench)")
        self.path, self.paths, self.repo_dir, self.branch, self._noted = path, [path], repo_dir, branch, set()
        self.machines = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n, "machine.json")))
        if not self.machines:
            raise UserError(f"{path} holds no machine's results: run the main job first")
        try:
            info = read_json(os.path.join(path, "benchmarks.json"), "benchmarks.json")
        except UserError:
            info = {}
        self.param_names = [{n: b.get("param_names") for n, b in info.items() if isinstance(b, dict)}
                            if isinstance(info, dict) else {}, dict(known_param_names or {})]
        listed = _git(repo_dir, "rev-list", "--first-parent", branch, "--")
        self.branch_hashes = None if listed is None else {c[:8] for c in listed.split()}  # None: no such branch

    def on_branch(self, name):
        return self.branch_hashes is None or name[:8] in self.branch_hashes

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

    def files(self, machine, env=None, every=False):
        """Result file names of ``machine`` (``env``: a part of the env name), sorted, regular files only; those of
        commits off the branch only if ``every`` (else named in a note)."""
        folder = os.path.join(self.path, machine)
        names = [n for n in sorted(os.listdir(folder)) if (m := RESULT_FILE.match(n))
                 and (env is None or env in m[2]) and os.path.isfile(os.path.join(folder, n))]
        off = sorted({n[:8] for n in names if not self.on_branch(n)})
        if off and not every and machine not in self._noted:
            self._noted.add(machine)
            print(f"note: results of {len(off)} commit(s) on machine {machine!r} not read: not on {self.branch}'s "
                  f"history: {', '.join(off[:5])}{', ...' if len(off) > 5 else ''}; name one to read it",
                  file=sys.stderr)
        return names if every else [n for n in names if self.on_branch(n)]

    def resolve(self, rev, machine):
        """``(hash8, commit)`` of ``rev`` (a git revision, or a hash prefix of at least 4 digits of a commit with
        results) on ``machine``; ``commit``: what the file's hash must start with."""
        full = _git(self.repo_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
        prefixes = {n[:8] for n in self.files(machine, every=True)}
        if full and full[:8] not in prefixes:
            raise UserError(f"commit {full[:8]} ({rev}) has no results on machine {machine!r}: "
                            f"benchmark it with asv run {full[:8]}^! --record-samples")
        commit = full or rev.lower()
        if re.fullmatch(r"[0-9a-f]{1,3}", commit):
            raise UserError(f"commit prefix {rev!r} is too short: give at least 4 hex digits")
        found = sorted(p for p in prefixes if re.fullmatch(r"[0-9a-f]{4,40}", commit) and p.startswith(commit[:8]))
        if len(found) != 1:
            raise UserError(f"commit prefix {rev!r} is ambiguous: {', '.join(found)}" if found else
                            f"unknown commit {rev!r}: not a git revision here, nor a commit with results on "
                            f"{machine!r}")
        if not self.on_branch(found[0]):
            print(f"note: commit {found[0]} ({rev}) is not on {self.branch}'s history: its stored results are read "
                  "as asked", file=sys.stderr)
        return found[0], commit

    def load(self, machine, hash8=None, env=None, commit=None):
        """One run: commit ``hash8`` (default: the newest commit with results) on ``machine``."""
        where = f"machine {machine!r}" + (f" in an env matching {env!r}" if env else "")
        names = self.files(machine, env, every=hash8 is not None)
        if hash8 is None and names:
            hash8 = max((self.load_file(machine, n) for n in names), key=lambda r: r.date).commit[:8]
        elif hash8 is None:
            mains = f" of commits on {self.branch}'s history" if self.branch_hashes is not None else ""
            raise UserError(f"no results{mains} for {where} in {self.path}")
        names = [n for n in names if n.startswith(hash8 + "-")]
        if len(names) != 1:
            envs = ", ".join(RESULT_FILE.match(n)[2] for n in names)
            raise UserError(f"commit {hash8} has results in several environments ({envs}): choose one with --env"
                            if names else f"commit {hash8} has no results on {where}")
        run = self.load_file(machine, names[0])
        if commit is not None and not run.commit.startswith(commit):
            raise UserError(f"unknown commit {commit}: results file {names[0]} holds commit {run.commit}")
        return run

    def load_file(self, machine, name):
        return load_run(os.path.join(self.path, machine, name), self.param_names, machine)


def _check(ok, message):
    if not ok:
        raise ValueError(message)


def load_run(path, param_names=(), machine=None):
    """One asv result file as a checked :class:`Run`; ``param_names``: dicts (benchmark -> names), tried in order."""
    label = os.path.join(*path.split(os.sep)[-2:])
    data = read_json(path, f"asv result file {label}")
    try:
        _check(isinstance(data, dict) and data.get("version") == 2, "not an asv 0.6 result file (version 2)")
        _check(isinstance(data["results"], dict), "results is not an object of rows")
        date, commit, env_name = data.get("date"), data.get("commit_hash"), data.get("env_name")
        _check(is_number(date) and 0 <= date < NEVER, f"date is {short(date)}, not ms since the epoch")
        _check(isinstance(commit, str) and commit and isinstance(env_name, str) and env_name,
               f"commit_hash {short(commit)} or env_name {short(env_name)} is not a string")
        run = Run(commit, machine or data["params"]["machine"], env_name, date,
                  {str(k): str(v) for k, v in data["params"].items()},
                  {str(k): str(v) for k, v in (data.get("env_vars") or {}).items()}, {})
        started = []
        for name, combos, row in _rows(data):
            started.append(row.get("started_at"))
            for point in _points(name, combos, row, param_names):
                run.points[(name, tuple(sorted(point.params.items())))] = point
        run.measured = max((v for v in started if is_number(v) and 0 < v < NEVER), default=None)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError) as exc:
        raise UserError(f"cannot read asv result file {label}: {str(exc)[:300] or type(exc).__name__}") from None
    return run


@functools.lru_cache(maxsize=None)
def _param(text):
    """asv's repr of a parameter value -> the value: ``'16'`` -> 16, ``"'concat'"`` -> ``'concat'``."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, str) or is_number(value) and math.isfinite(value) else text  # OverflowError


def _points(name, combos, row, param_names):
    _check(isinstance(row.get("params") or [], list) and all(isinstance(p, list) for p in row.get("params") or []),
           f"{name}: params is {short(row.get('params'))}, not a list of lists")
    n, width = len(combos), len(combos[0] or ())
    names = next((s[name] for s in param_names if isinstance(s.get(name), list) and len(s[name]) == width),
                 [f"param{i + 1}" for i in range(width)])
    columns = {k: v for k, v in row.items() if k in ("result", "samples") or k.startswith("stats_")}
    for key, column in columns.items():
        _check(column is None or isinstance(column, list) and len(column) == n,
               f"{name}: {key} holds {short(column)}, not {n} values, one per parameter combination")
    timed = name.rsplit(".", 1)[-1].startswith("time")
    for i, combo in enumerate(combos):
        stats = {k[6:]: v[i] for k, v in columns.items() if k.startswith("stats_") and v and v[i] is not None}
        _check(all(is_finite(v) or UNBOUNDED.get(k) == v for k, v in stats.items()),
               f"{name}: malformed statistics {short(stats)}")
        samples = (columns.get("samples") or [None] * n)[i]
        _check(samples is None or isinstance(samples, list) and all(is_finite(x) and x > 0 for x in samples),
               f"{name}: samples must be a list of positive seconds")
        value = (columns.get("result") or [None] * n)[i]  # asv stores null when every point failed
        if value is None:
            value = FAILED
        elif isinstance(value, float) and math.isnan(value):
            value = SKIPPED
        else:
            _check(is_finite(value) and (value > 0 or not timed),
                   f"{name}: {short(value)} is not a valid {'time' if timed else 'result'}")
        yield Point(name, {k: _param(str(v)) for k, v in zip(names, combo or ())}, value, stats, samples)
