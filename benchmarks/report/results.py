"""Finding and reading asv result files: machine, commit, environment, points.

A *point* is one benchmark at one parameter combination at one commit: the
value asv stored (the median, in seconds, for ``time_`` benchmarks; None when
the benchmark failed; NaN when it was skipped), its statistics and, when asv ran
with ``--record-samples``, every timing sample.
"""

import ast
import functools
import itertools
import json
import math
import os
import subprocess
from dataclasses import dataclass, field

FAILED = "failed"  # asv stored null: setup (the gate) or the benchmark raised
SKIPPED = "n/a"  # asv stored NaN (NotImplementedError), or the commit has no such result


class ReportError(Exception):
    """A problem the user can fix: the message is one line and names the fix."""


@dataclass(frozen=True)
class Point:
    """One benchmark at one parameter combination, from one result file.

    ``params`` maps asv's ``param_names`` to the parameter values (parsed from
    asv's repr strings: ``'16'`` -> 16, ``"'concat'"`` -> "concat").
    ``value`` is seconds for time benchmarks, a float, or the string
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
    points: dict  # (benchmark, tuple(params.items())) -> Point

    def value(self, benchmark, **params):
        """The stored value of ``benchmark`` at ``params``; SKIPPED if the run lacks it."""
        point = self.points.get((benchmark, tuple(sorted(params.items()))))
        return SKIPPED if point is None else point.value


def _git(repo_dir, *args):
    out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def _parse_param(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _cell(value):
    if value is None:
        return FAILED
    if isinstance(value, float) and math.isnan(value):
        return SKIPPED
    return value


class ResultsDir:
    """asv's results directory: ``<results_dir>/<machine>/<hash8>-<env_name>.json``.

    Args:
        results_dir: path of asv's ``results_dir`` (``.asv/results`` here).
        repo_dir: git checkout used to resolve revisions such as ``HEAD~1``.

    Raises:
        ReportError: the directory does not exist or holds no machine.
    """

    def __init__(self, results_dir, repo_dir="."):
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
        self.param_names = self._load_param_names()

    def _load_param_names(self):
        """benchmark name -> asv ``param_names``, from asv's ``benchmarks.json`` (if any)."""
        try:
            with open(os.path.join(self.path, "benchmarks.json")) as f:
                benchmarks = json.load(f)
        except (OSError, ValueError):
            return {}
        return {name: b.get("param_names", []) for name, b in benchmarks.items() if isinstance(b, dict)}

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

    def files(self, machine):
        """Result file names of ``machine``, sorted."""
        folder = os.path.join(self.path, machine)
        return sorted(n for n in os.listdir(folder) if n.endswith(".json") and n != "machine.json")

    def resolve(self, rev, machine):
        """The 8-character hash prefix that names ``rev``'s result files on ``machine``.

        ``rev`` is any git revision (``HEAD~1``, a branch, a hash) or a hash
        prefix of a commit that has results.

        Raises:
            ReportError: ``rev`` is neither a revision nor a prefix of a commit
                with results, or the commit has no results on ``machine``.
        """
        full = _git(self.repo_dir, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        prefixes = {name.split("-", 1)[0] for name in self.files(machine)}
        if full is not None:
            if full[:8] not in prefixes:
                raise ReportError(
                    f"commit {full[:8]} ({rev}) has no results on machine {machine!r}: "
                    f"benchmark it with asv run {full[:8]}^! --record-samples"
                )
            return full[:8]
        matches = sorted(p for p in prefixes if len(rev) >= 4 and p.startswith(rev.lower()))
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ReportError(f"commit prefix {rev!r} is ambiguous: {', '.join(matches)}")
        raise ReportError(f"unknown commit {rev!r}: not a git revision here, nor a commit with results on {machine!r}")

    def load(self, machine, hash8=None, env=None):
        """Load one run: commit ``hash8`` (default: the newest commit with results) on ``machine``.

        Raises:
            ReportError: no result file matches, or several environments do and
                ``env`` does not choose one.
        """
        names = self.files(machine)
        if hash8 is None:
            runs = [load_run(os.path.join(self.path, machine, n), self.param_names) for n in names]
            runs = [r for r in runs if env is None or env in r.env_name]
            if not runs:
                raise ReportError(f"no results for machine {machine!r} in {self.path}")
            return max(runs, key=lambda r: r.date)
        names = [n for n in names if n.startswith(hash8 + "-") and (env is None or env in n)]
        if not names:
            raise ReportError(f"commit {hash8} has no results on machine {machine!r}" + (f" in env {env!r}" if env else ""))
        if len(names) > 1:
            envs = ", ".join(n.split("-", 1)[1][:-5] for n in names)
            raise ReportError(f"commit {hash8} has results in several environments ({envs}): choose one with --env")
        return load_run(os.path.join(self.path, machine, names[0]), self.param_names)


def _local_asv_machine():
    """The machine name ``asv machine`` recorded for this host (``~/.asv-machine.json``), or None."""
    try:
        with open(os.path.expanduser("~/.asv-machine.json")) as f:
            names = [k for k in json.load(f) if k != "version"]
    except (OSError, ValueError, AttributeError):
        return None
    return names[0] if len(names) == 1 else None


def load_run(path, param_names=None):
    """Read one asv result file into a :class:`Run` (through asv's own ``Results.load``).

    Raises:
        ReportError: the file is not a readable asv result file.
    """
    from asv.results import Results
    from asv.util import UserError

    try:
        results = Results.load(path)
    except (UserError, OSError, ValueError) as exc:
        raise ReportError(f"cannot read asv result file {path}: {exc}") from None
    points = {}
    for name in results.get_all_result_keys():
        for point in _points(results, name, (param_names or {}).get(name)):
            points[(name, tuple(sorted(point.params.items())))] = point
    return Run(
        commit=results.commit_hash,
        machine=results.params.get("machine", os.path.basename(os.path.dirname(path))),
        env_name=results.env_name,
        date=results.date or 0,
        machine_params=dict(results.params),
        env_vars=dict(results.env_vars or {}),
        points=points,
    )


def _points(results, name, names):
    """Every parameter combination of benchmark ``name`` in ``results``, as Points."""
    params = results.get_result_params(name) or []
    names = names if names and len(names) == len(params) else [f"param{i + 1}" for i in range(len(params))]
    values = results.get_result_value(name, params)
    stats = results.get_result_stats(name, params)
    samples = results.get_result_samples(name, params)
    # asv keeps one entry per combination, in itertools.product order ([()] if unparameterized).
    for i, combo in enumerate(itertools.product(*params)):
        yield Point(
            benchmark=name,
            params={n: _parse_param(v) for n, v in zip(names, combo)},
            value=_cell(values[i] if values is not None and i < len(values) else None),
            stats=(stats[i] if stats and i < len(stats) else None) or {},
            samples=samples[i] if samples and i < len(samples) else None,
        )
