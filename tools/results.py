"""The one reader of asv's result files: plain JSON for the main job, the gate and bisect; checked runs for the report.

asv stores one JSON file per commit and environment under
``<results_dir>/<machine>/<hash8>-<env_name>.json``: ``results`` maps a benchmark to one row, whose columns
``result_columns`` names (``result``, ``params``, ``version``, ..., ``samples``). A *point* is one benchmark at one
parameter combination, labelled as ``asv compare`` labels it (``name(16, 'concat')``); its value is a number, None
(failed: setup's correctness check or the benchmark raised) or NaN (skipped: NotImplementedError).
"""

import ast
import errno
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
from pathlib import Path

from . import common, paths
from .common import UserError

# --- plain JSON, for the main job, the gate and bisect --------------------------------------------


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
        data = json.loads(path.read_text())
        columns = data["result_columns"]
        for name, row in data["results"].items():
            row = dict(zip(columns, row))
            params = row.get("params") or []
            combos = list(itertools.product(*params)) if params else [None]
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
    names = {p.name for p in points.values()}
    unsampled = any(p.name.rsplit(".", 1)[-1].startswith("time_") and is_measured(p.value) and p.samples is None
                    for p in points.values())
    return bool(points) and set(benchmarks) <= names and not unsampled


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
    """Sorted labels of the points with a value at ``base`` (``{label: Stored}``) that are n/a at ``head``.

    n/a is NaN (a skip) or no stored point; a failure is a failure, not a vanished point; a point whose
    benchmark or label is a key of ``retired_names`` (default :func:`retired`) was removed on purpose.
    """
    if not head:  # no results at all: the commit failed to build, reported as such
        return []
    retired_names = retired() if retired_names is None else retired_names
    labels = []
    for label, point in base.items():
        if is_measured(point.value) and label not in retired_names and point.name not in retired_names:
            now = head.get(label)
            if now is None or (is_number(now.value) and math.isnan(now.value)):
                labels.append(label)
    return sorted(labels)


def quarantine_unreadable(machine):
    """Move every result file of ``machine`` that is not a regular file or not readable JSON to ``.asv/corrupt/``.

    asv writes result files in place: a killed run leaves a truncated one, which asv can neither read nor save
    over, so its commit would never be measured again; a FIFO would block asv forever. Moved aside, the commit
    has no results and is measured again.
    """
    folder = results_dir() / machine
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        reason = not_regular(path)
        if not reason and path.name != "machine.json":
            try:
                data = json.loads(path.read_text())
                assert isinstance(data["results"], dict) and isinstance(data["result_columns"], list)
            except (OSError, ValueError, KeyError, TypeError, AssertionError, RecursionError) as error:
                reason = f"not an asv result file: {type(error).__name__}"
        elif reason:
            reason = f"{reason}, not a regular file"
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


# --- checked runs, for the report -----------------------------------------------------------------
#
# The report's reader checks what it reads: a value that is neither a number, null nor NaN, a time that is not
# positive and finite, or malformed samples or statistics make the file unreadable (one UserError line), never a
# figure. A machine is named as asv names it, by its folder's machine.json ("machine"), and asv reads a result
# file only if it names that machine too.

FAILED = "failed"  # asv stored null: setup (the correctness check) or the benchmark raised
SKIPPED = "n/a"  # asv stored NaN (NotImplementedError), or the commit has no such result
RESULT_FILE = re.compile(r"^([0-9a-f]{8})-(.+)\.json$")  # <hash8>-<env_name>.json
NEVER = 253402300800000  # ms since the epoch of the year 10000


@dataclass(frozen=True)
class Point:
    """One benchmark at one parameter combination: ``params`` {param name: value}, ``value`` a number (seconds
    for a timing) or FAILED / SKIPPED, asv's ``stats``, the timing ``samples`` (or None)."""

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


def short(value):
    """``value``'s repr, at most about 60 characters (for one-line messages)."""
    return _REPR.repr(value)


def not_regular(path):
    """None if ``path`` is (a symlink to) a regular file or missing, else what it is (``a FIFO``)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else paths.kind(mode)


def read_json(path, what):
    """The JSON in ``path``, never opening a FIFO or device; UserError naming ``what`` if it cannot be read."""
    kind = not_regular(path)
    if kind:
        raise UserError(f"cannot read {what}: it is {kind}, not a regular file")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except RecursionError:
        raise UserError(f"cannot read {what}: nested too deeply") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {what}: {str(exc)[:200] or type(exc).__name__}") from None


def _git(repo_dir, *args):
    try:
        out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def _parse_param(text):
    """asv's repr of a parameter value -> the value: ``'16'`` -> 16, ``np.int64(16)`` -> 16."""
    wrapped = re.fullmatch(r"np\.\w+\((.*)\)", text)
    try:
        value = ast.literal_eval(wrapped.group(1) if wrapped else text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if is_finite(value) or isinstance(value, str) else text


def param_sort_key(value):
    """Numbers first, in order, then everything else by its text."""
    return (0, value, "") if is_number(value) else (1, 0, str(value))


class ResultsDir:
    """asv's results directory, ``<results_dir>/<machine folder>/<hash8>-<env_name>.json``, for the report.

    Only the result files of commits on ``branch``'s first-parent history (the commits asv's graphs show) are
    read unless a commit is named; the others are named in a note. ``known_param_names`` (benchmark ->
    param_names) stands in where asv's benchmarks.json is missing or does not fit.
    """

    def __init__(self, results_dir, repo_dir=".", known_param_names=None, branch=common.BRANCH):
        self.path, self.paths, self.repo_dir, self.branch = results_dir, [results_dir], repo_dir, branch
        self._noted = set()
        if not os.path.isdir(results_dir):
            raise UserError(f"no asv results directory at {results_dir}: run the main job first "
                            "(python3 tools/dev.py bench)")
        self.folders = {}  # machine -> its folder
        for name in sorted(os.listdir(results_dir)):
            folder = os.path.join(results_dir, name)
            if not os.path.isfile(os.path.join(folder, "machine.json")):
                continue
            path = os.path.join(folder, "machine.json")
            try:
                machine = read_json(path, path)["machine"]
            except (UserError, KeyError, TypeError):
                machine = None
            if not isinstance(machine, str) or not machine:
                raise UserError(f"{path} is not a readable asv machine file (no machine name in it): asv would "
                                "skip this machine")
            if machine in self.folders:
                raise UserError(f"machine {machine!r} has results in both {self.folders[machine]} and {folder} (as "
                                "their machine.json say): leave one of them out")
            self.folders[machine] = folder
        self.machines = sorted(self.folders)
        if not self.machines:
            raise UserError(f"{results_dir} holds no machine's results: run the main job first")
        suite_file = os.path.join(results_dir, "benchmarks.json")
        if not_regular(suite_file):
            print(f"note: skipped {suite_file}: {not_regular(suite_file)}, not a regular file", file=sys.stderr)
        try:
            suite_names = {} if not_regular(suite_file) else read_json(suite_file, "benchmarks.json")
        except UserError:
            suite_names = {}
        self.param_names = [{n: b["param_names"] for n, b in suite_names.items() if isinstance(b, dict)
                             and isinstance(b.get("param_names"), list)} if isinstance(suite_names, dict) else {},
                            dict(known_param_names or {})]

    def pick_machine(self, machine=None):
        """The machine to report: ``machine`` if given, else this host's asv machine, else the only one."""
        if machine is not None:
            if machine not in self.machines:
                held = [f"; folder {folder} holds machine {name!r} (its machine.json's name, asv's)"
                        for name, folder in self.folders.items() if os.path.basename(folder) == machine]
                raise UserError(f"no results for machine {machine!r} in {self.path} (machines with results: "
                                f"{', '.join(self.machines)}{''.join(held)})")
            return machine
        recorded = os.path.expanduser("~/.asv-machine.json")
        try:
            names = [k for k in read_json(recorded, recorded) if k != "version"]
        except (UserError, TypeError):
            names = []
        for local in (common.machine_name(), names[0] if len(names) == 1 else None):
            if local in self.machines:
                return local
        if len(self.machines) == 1:
            return self.machines[0]
        raise UserError(f"results from several machines in {self.path} ({', '.join(self.machines)}): "
                        "choose one with --machine")

    @functools.cached_property
    def branch_hashes(self):
        """The hash8 of every commit of the branch's first-parent history, or None without such a branch."""
        listed = _git(self.repo_dir, "rev-list", "--first-parent", f"{self.branch}", "--")
        return None if listed is None else {c[:8] for c in listed.split()}

    def on_branch(self, name):
        return self.branch_hashes is None or name[:8] in self.branch_hashes

    def files(self, machine, env=None, every=False):
        """Result file names of ``machine`` (``env``: a part of the env name), sorted; those of commits off the
        branch only if ``every`` (else named in a note); a name that is not a regular file skipped, with a note."""
        folder, names = self.folders[machine], []
        for n in sorted(os.listdir(folder)):
            m = RESULT_FILE.match(n)
            if not m or (env is not None and env not in m.group(2)):
                continue
            kind = not_regular(os.path.join(folder, n)) or (None if os.path.exists(os.path.join(folder, n))
                                                              else "a dangling symlink")
            if kind is None:
                names.append(n)
            elif ("file", machine, n) not in self._noted:
                self._noted.add(("file", machine, n))
                print(f"note: skipped {os.path.join(folder, n)}: {kind}, not a regular file", file=sys.stderr)
        off = sorted({n[:8] for n in names if not self.on_branch(n)})
        if every:
            return names
        if off and ("machine", machine) not in self._noted:
            self._noted.add(("machine", machine))
            print(f"note: results of {len(off)} commit(s) on machine {machine!r} not read: not on {self.branch}'s "
                  f"history: {', '.join(off[:5])}{', ...' if len(off) > 5 else ''}; name one to read it",
                  file=sys.stderr)
        return [n for n in names if self.on_branch(n)]

    def resolve(self, rev, machine):
        """``(hash8, commit)`` of ``rev`` (a git revision, or a hash prefix of at least 4 digits of a commit with
        results) on ``machine``; ``commit``: what the file's hash must start with."""
        full = _git(self.repo_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
        prefixes = {RESULT_FILE.match(n).group(1) for n in self.files(machine, every=True)}
        if full:
            if full[:8] not in prefixes:
                raise UserError(f"commit {full[:8]} ({rev}) has no results on machine {machine!r}: "
                                f"benchmark it with asv run {full[:8]}^! --record-samples")
            hash8, commit = full[:8], full
        else:
            low = rev.lower()
            if re.fullmatch(r"[0-9a-f]{1,3}", low):
                raise UserError(f"commit prefix {rev!r} is too short: give at least 4 hex digits")
            found = sorted(p for p in prefixes if re.fullmatch(r"[0-9a-f]{4,40}", low) and p.startswith(low[:8]))
            if len(found) != 1:
                raise UserError(f"commit prefix {rev!r} is ambiguous: {', '.join(found)}" if found else
                                f"unknown commit {rev!r}: not a git revision here, nor a commit with results on "
                                f"{machine!r}")
            hash8, commit = found[0], low
        if not self.on_branch(hash8):
            print(f"note: commit {hash8} ({rev}) is not on {self.branch}'s history: its stored results are read "
                  "as asked", file=sys.stderr)
        return hash8, commit

    def load(self, machine, hash8=None, env=None, commit=None):
        """One run: commit ``hash8`` (default: the newest commit with results) on ``machine``."""
        where = f"machine {machine!r}" + (f" in an env matching {env!r}" if env else "")
        names = self.files(machine, env, every=hash8 is not None)
        if hash8 is None:
            runs = [self.load_file(machine, n) for n in names]
            if not runs:
                mains = f" of commits on {self.branch}'s history" if self.branch_hashes is not None else ""
                raise UserError(f"no results{mains} for {where} in {self.path}")
            hash8 = max(runs, key=lambda r: r.date).commit[:8]
        names = [n for n in names if n.startswith(hash8 + "-")]
        if not names:
            raise UserError(f"commit {hash8} has no results on {where}")
        if len(names) > 1:
            envs = ", ".join(RESULT_FILE.match(n).group(2) for n in names)
            raise UserError(f"commit {hash8} has results in several environments ({envs}): choose one with --env")
        run = self.load_file(machine, names[0])
        if commit is not None and not run.commit.startswith(commit):
            raise UserError(f"unknown commit {commit}: results file {names[0]} holds commit {run.commit}")
        return run

    def load_file(self, machine, name):
        return load_run(os.path.join(self.folders[machine], name), self.param_names, machine)


def load_run(path, param_names=(), machine=None):
    """One asv result file (plain JSON, as asv's Results.load reads it) as a checked :class:`Run`.

    ``param_names``: dicts (benchmark -> names), tried in order. ``machine``: the machine the file must name.
    """
    label = os.path.join(*path.split(os.sep)[-2:])
    data = read_json(path, f"asv result file {label}")
    try:
        if not isinstance(data, dict) or data.get("version") != 2:
            raise ValueError("not an asv 0.6 result file (version 2)")
        params = data["params"]
        if not isinstance(params, dict):
            raise ValueError(f"params is {short(params)}, not an object")
        if machine is not None and params.get("machine") != machine:
            raise UserError(f"cannot read asv result file {label}: it is of machine {short(params.get('machine'))}, "
                            f"but its folder's machine.json names {machine!r} (asv skips such a file)")
        machine_params = {str(k): str(v) for k, v in params.items()}
        for key in ("ram", "num_cpu"):
            if not re.fullmatch(r"[0-9]{0,20}", machine_params.get(key, "")):
                raise ValueError(f"machine field {key} is {short(params[key])}, not a number")
        columns, rows = data["result_columns"], data["results"]
        if not isinstance(rows, dict) or not isinstance(columns, list):
            raise ValueError("results is not an object of rows")
        started = []
        run = Run(commit=_text(data.get("commit_hash"), "commit_hash"),
                  machine=_text(params.get("machine", os.path.basename(os.path.dirname(path))), "machine"),
                  env_name=_text(data.get("env_name"), "env_name"), date=_date(data.get("date")),
                  machine_params=machine_params, env_vars={str(k): str(v) for k, v in dict(data.get("env_vars")
                                                                                             or {}).items()},
                  points={})
        for name, row in rows.items():
            if not isinstance(row, list):
                raise ValueError(f"{name}: {short(row)} is not a row")
            row = dict(zip(columns, row))
            started += [row["started_at"]] if is_number(row.get("started_at")) else []
            for point in _points(name, row, param_names):
                run.points[(name, tuple(sorted(point.params.items())))] = point
        run.measured = max((v for v in started if 0 < v < NEVER), default=None)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError) as exc:
        raise UserError(f"cannot read asv result file {label}: {str(exc)[:300] or type(exc).__name__}") from None
    return run


def _text(value, what):
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} is {short(value)}, not a string")
    return value


def _date(value):
    if not is_number(value) or not 0 <= value < NEVER:
        raise ValueError(f"date is {short(value)}, not ms since the epoch")
    return value


UNBOUNDED = {"ci_99_a": -math.inf, "ci_99_b": math.inf}  # asv's 99 % bounds of one sample (--quick): none


def _points(name, row, param_names):
    """Every parameter combination of benchmark ``name`` (its row by column name), as checked Points."""
    params = row.get("params") or []
    if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
        raise ValueError(f"{name}: params is {short(params)}, not a list of lists")
    names = next((source[name] for source in param_names if len(source.get(name) or ()) == len(params)
                  and source.get(name) is not None), [f"param{i + 1}" for i in range(len(params))])
    combos = list(itertools.product(*params))
    timed = name.rsplit(".", 1)[-1].startswith("time")
    columns = {key: row.get(key) for key in ("result", "samples", *(c for c in row if c.startswith("stats_")))}
    for key, column in columns.items():
        if column is not None and (not isinstance(column, list) or len(column) != len(combos)):
            raise ValueError(f"{name}: {len(column) if isinstance(column, list) else short(column)} "
                             f"{'values' if key == 'result' else key} for {len(combos)} parameter combinations")
    columns["result"] = columns["result"] or [None] * len(combos)  # asv stores null when every point failed
    for i, combo in enumerate(combos):
        stat = {k[6:]: v[i] for k, v in columns.items() if k.startswith("stats_") and v and v[i] is not None}
        if not all(is_finite(v) or UNBOUNDED.get(k, 0) == v for k, v in stat.items()):
            raise ValueError(f"{name}: malformed statistics {short(stat)}")
        value = columns["result"][i]
        if value is None:
            value = FAILED
        elif isinstance(value, float) and math.isnan(value):
            value = SKIPPED
        elif not is_finite(value) or (timed and value <= 0):
            raise ValueError(f"{name}: {short(value)} is not a valid {'time' if timed else 'result'}")
        samples = columns["samples"][i] if columns["samples"] else None
        if samples is not None and (not isinstance(samples, list) or not all(is_finite(x) and x > 0 for x in samples)):
            raise ValueError(f"{name}: samples must be a list of positive seconds")
        yield Point(benchmark=name, params={n: _parse_param(str(v)) for n, v in zip(names, combo)}, value=value,
                    stats=stat, samples=samples)
