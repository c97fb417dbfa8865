"""Finding and reading asv result files: machine, commit, environment, points.

A *point* is one benchmark at one parameter combination at one commit: the
value asv stored (the median, in seconds, for ``time_`` benchmarks; None when
the benchmark failed; NaN when it was skipped), its statistics and, when asv ran
with ``--record-samples``, every timing sample.

Result files are read through asv's own ``asv.results.Results.load`` and then
checked: a value that is neither a number, null nor NaN, a time that is not
positive and finite, or malformed samples make the file unreadable (a
:class:`ReportError`), never a figure.
"""

import ast
import functools
import itertools
import json
import math
import os
import re
import subprocess
from dataclasses import dataclass, field

FAILED = "failed"  # asv stored null: setup (the gate) or the benchmark raised
SKIPPED = "n/a"  # asv stored NaN (NotImplementedError), or the commit has no such result
RESULT_FILE = re.compile(r"^([0-9a-f]{8})-(.+)\.json$")  # <hash8>-<env_name>.json


class ReportError(Exception):
    """A problem the user can fix: the message is one line and names the fix."""


@dataclass(frozen=True)
class Point:
    """One benchmark at one parameter combination, from one result file.

    ``params`` maps asv's ``param_names`` to the parameter values (parsed from
    asv's repr strings: ``'16'`` -> 16, ``"'concat'"`` -> "concat").
    ``value`` is a number (seconds for time benchmarks) or the string
    ``FAILED``/``SKIPPED``. ``samples`` is a list of seconds or None.
    """

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

    def value(self, benchmark, **params):
        """The stored value of ``benchmark`` at ``params``; SKIPPED if the run lacks it."""
        point = self.points.get((benchmark, tuple(sorted(params.items()))))
        return SKIPPED if point is None else point.value


def is_number(x):
    """A real number (not a bool): what a table cell can compute with."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _git(repo_dir, *args):
    try:
        out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True)
    except OSError:  # no git, or no such directory: revisions cannot be resolved
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
    return value if isinstance(value, (int, float, str)) else text


def param_sort_key(value):
    """Numbers first, in order, then everything else by its text."""
    return (0, value, "") if is_number(value) else (1, 0, str(value))


class ResultsDir:
    """asv's results directory: ``<results_dir>/<machine>/<hash8>-<env_name>.json``.

    Args:
        results_dir: path of asv's ``results_dir`` (``.asv/results`` here).
        repo_dir: git checkout used to resolve revisions such as ``HEAD~1``.
        known_param_names: benchmark -> ``param_names``, used where asv's
            ``benchmarks.json`` is missing or does not fit a result.

    Raises:
        ReportError: the directory does not exist or holds no machine.
    """

    def __init__(self, results_dir, repo_dir=".", known_param_names=None):
        self.path = results_dir
        self.repo_dir = repo_dir
        if not os.path.isdir(results_dir):
            raise ReportError(
                f"no asv results directory at {results_dir}: run the main job first "
                "(python3 tools/dev.py bench)"
            )
        self.machines = sorted(
            name for name in os.listdir(results_dir)
            if os.path.isfile(os.path.join(results_dir, name, "machine.json"))
        )
        if not self.machines:
            raise ReportError(f"{results_dir} holds no machine's results: run the main job first")
        self.param_names = [self._load_param_names(), dict(known_param_names or {})]

    def _load_param_names(self):
        """benchmark name -> asv ``param_names``, from asv's ``benchmarks.json`` ({} if unusable)."""
        try:
            with open(os.path.join(self.path, "benchmarks.json")) as f:
                benchmarks = json.load(f)
        except (OSError, ValueError):
            return {}
        if not isinstance(benchmarks, dict):
            return {}
        return {name: b["param_names"] for name, b in benchmarks.items()
                if isinstance(b, dict) and isinstance(b.get("param_names"), list)
                and all(isinstance(n, str) for n in b["param_names"])}

    def pick_machine(self, machine=None):
        """The machine to report: ``machine`` if given, else this host's asv machine, else the only one."""
        if machine is not None:
            if machine not in self.machines:
                raise ReportError(
                    f"no results for machine {machine!r} in {self.path} "
                    f"(machines with results: {', '.join(self.machines)})"
                )
            return machine
        local = _local_asv_machine()
        if local in self.machines:
            return local
        if len(self.machines) == 1:
            return self.machines[0]
        raise ReportError(
            f"results from several machines in {self.path} ({', '.join(self.machines)}): choose one with --machine"
        )

    def files(self, machine, env=None):
        """Result file names of ``machine`` (``<hash8>-<env>.json``; ``env`` a part of the env name), sorted."""
        folder = os.path.join(self.path, machine)
        return sorted(
            n for n in os.listdir(folder)
            if (m := RESULT_FILE.match(n)) and (env is None or env in m.group(2))
            and os.path.isfile(os.path.join(folder, n))
        )

    def resolve(self, rev, machine):
        """``(hash8, commit)``: the prefix that names ``rev``'s result files on ``machine``, and
        what the file's commit hash must start with (git's full hash, or the hex ``rev`` itself).

        ``rev`` is any git revision (``HEAD~1``, a branch, a hash) or a hash
        prefix (at least 4 characters) of a commit that has results.

        Raises:
            ReportError: ``rev`` is neither a revision nor a prefix of a commit
                with results, or the commit has no results on ``machine``.
        """
        full = _git(self.repo_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
        prefixes = {RESULT_FILE.match(n).group(1) for n in self.files(machine)}
        if full:
            if full[:8] not in prefixes:
                raise ReportError(
                    f"commit {full[:8]} ({rev}) has no results on machine {machine!r}: "
                    f"benchmark it with asv run {full[:8]}^! --record-samples"
                )
            return full[:8], full
        rev_lower = rev.lower()
        if re.fullmatch(r"[0-9a-f]{1,3}", rev_lower):
            raise ReportError(f"commit prefix {rev!r} is too short: give at least 4 hex digits")
        matches = sorted(p for p in prefixes if re.fullmatch(r"[0-9a-f]{4,40}", rev_lower)
                         and p.startswith(rev_lower[:8]))
        if len(matches) == 1:
            return matches[0], rev_lower
        if len(matches) > 1:
            raise ReportError(f"commit prefix {rev!r} is ambiguous: {', '.join(matches)}")
        raise ReportError(f"unknown commit {rev!r}: not a git revision here, nor a commit with results on {machine!r}")

    def load(self, machine, hash8=None, env=None, commit=None):
        """Load one run: commit ``hash8`` (default: the newest commit with results) on ``machine``.

        ``commit``, if given, is what the run's full hash must start with.

        Raises:
            ReportError: no result file matches, or several environments do and
                ``env`` does not choose one.
        """
        where = f"machine {machine!r}" + (f" in an env matching {env!r}" if env else "")
        names = self.files(machine, env)
        if hash8 is None:
            runs = [self.load_file(machine, n) for n in names]
            if not runs:
                raise ReportError(f"no results for {where} in {self.path}")
            hash8 = max(runs, key=lambda r: r.date).commit[:8]
        names = [n for n in names if n.startswith(hash8 + "-")]
        if not names:
            raise ReportError(f"commit {hash8} has no results on {where}")
        if len(names) > 1:
            envs = ", ".join(RESULT_FILE.match(n).group(2) for n in names)
            raise ReportError(f"commit {hash8} has results in several environments ({envs}): choose one with --env")
        run = self.load_file(machine, names[0])
        if commit is not None and not run.commit.startswith(commit):
            raise ReportError(f"unknown commit {commit}: results file {names[0]} holds commit {run.commit}")
        return run

    def load_file(self, machine, name):
        """Read ``<machine>/<name>`` (see :func:`load_run`)."""
        return load_run(os.path.join(self.path, machine, name), self.param_names)


def _local_asv_machine():
    """The machine name ``asv machine`` recorded for this host (``~/.asv-machine.json``), or None."""
    try:
        with open(os.path.expanduser("~/.asv-machine.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    names = [k for k in data if k != "version"] if isinstance(data, dict) else []
    return names[0] if len(names) == 1 else None


def import_asv_results():
    """asv's ``Results`` and ``UserError``; a ReportError naming the fix if asv is missing."""
    try:
        from asv.results import Results
        from asv.util import UserError
    except ImportError:
        raise ReportError(
            "asv is not installed here: run inside .venv (source .venv/bin/activate), "
            "which either of the two commands creates"
        ) from None
    return Results, UserError


def load_run(path, param_names=()):
    """Read one asv result file into a :class:`Run`, through asv's own ``Results.load``.

    ``param_names`` is a sequence of dicts (benchmark -> names), tried in order.

    Raises:
        ReportError: the file is not a readable, well-formed asv result file.
    """
    Results, UserError = import_asv_results()
    short = os.path.join(*path.split(os.sep)[-2:])
    try:
        results = Results.load(path)
        run = Run(
            commit=_text(results.commit_hash, "commit_hash"),
            machine=_text(results.params.get("machine", os.path.basename(os.path.dirname(path))), "machine"),
            env_name=_text(results.env_name, "env_name"),
            date=_date(results.date),
            machine_params={str(k): str(v) for k, v in dict(results.params).items()},
            env_vars={str(k): str(v) for k, v in dict(results.env_vars or {}).items()},
            points={},
        )
        for name in results.get_all_result_keys():
            names = _names_for(name, results.get_result_params(name), param_names)
            for point in _points(results, name, names):
                run.points[(name, tuple(sorted(point.params.items())))] = point
    except (UserError, OSError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        reason = str(exc).replace(path, short) or type(exc).__name__
        raise ReportError(f"cannot read asv result file {short}: {reason}") from None
    return run


def _text(value, what):
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} is {value!r}, not a string")
    return value


def _date(value):
    """asv's commit date: ms since the epoch, between 1970 and 9999."""
    if not is_number(value) or not 0 <= value < 253402300800000:
        raise ValueError(f"date is {value!r}, not ms since the epoch")
    return value


def _names_for(name, params, param_names):
    """The first ``param_names`` that fits the result's params, else param1, param2, ..."""
    if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
        raise ValueError(f"{name}: params is {params!r}, not a list of lists")
    for source in param_names:
        names = source.get(name)
        if names is not None and len(names) == len(params):
            return names
    return [f"param{i + 1}" for i in range(len(params))]


def _value(value, name, timed):
    """None -> FAILED, NaN -> SKIPPED, a number -> itself (a time must be finite and positive)."""
    if value is None:
        return FAILED
    if isinstance(value, float) and math.isnan(value):
        return SKIPPED
    if not is_number(value) or math.isinf(value) or (timed and value <= 0):
        raise ValueError(f"{name}: {value!r} is not a valid {'time' if timed else 'result'}")
    return value


def _samples(samples, name):
    if samples is None:
        return None
    if not isinstance(samples, list) or not all(is_number(s) and math.isfinite(s) and s > 0 for s in samples):
        raise ValueError(f"{name}: samples must be a list of positive seconds")
    return samples


def _points(results, name, names):
    """Every parameter combination of benchmark ``name`` in ``results``, as Points."""
    params = results.get_result_params(name)
    values = results.get_result_value(name, params)
    stats = results.get_result_stats(name, params)
    samples = results.get_result_samples(name, params)
    timed = name.rsplit(".", 1)[-1].startswith("time")
    # asv keeps one entry per combination, in itertools.product order ([()] if unparameterized).
    for i, combo in enumerate(itertools.product(*params)):
        stat = (stats[i] if stats and i < len(stats) else None) or {}
        if not isinstance(stat, dict) or not all(is_number(v) for v in stat.values()):
            raise ValueError(f"{name}: malformed statistics {stat!r}")
        yield Point(
            benchmark=name,
            params={n: _parse_param(str(v)) for n, v in zip(names, combo)},
            value=_value(values[i] if values is not None and i < len(values) else None, name, timed),
            stats=stat,
            samples=_samples(samples[i] if samples and i < len(samples) else None, name),
        )
