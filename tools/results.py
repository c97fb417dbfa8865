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


FAILED = "failed"  # asv stored null: setup (the gate) or the benchmark raised
SKIPPED = "n/a"  # asv stored NaN (NotImplementedError), or the commit has no such result
RESULT_FILE = re.compile(r"^([0-9a-f]{8})-(.+)\.json$")  # <hash8>-<env_name>.json


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
    measured: int = None  # when the last benchmark of the run started, ms since the epoch (None if unknown)

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


def short(value):
    """``value``'s repr, at most about 60 characters (for one-line messages)."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60


def not_regular(path):
    """None if ``path`` is (a symlink to) a regular file, else what it is (``a FIFO``): never open such a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # missing or unreadable: opening it fails with its own message
    return None if stat.S_ISREG(mode) else paths.kind(mode)


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
    return value if is_finite(value) or isinstance(value, str) else text


def param_sort_key(value):
    """Numbers first, in order, then everything else by its text."""
    return (0, value, "") if is_number(value) else (1, 0, str(value))


def machine_folders(results_dir):
    """``{folder name: path}`` of the machines in an asv results directory: its folders holding a machine.json."""
    return {name: os.path.join(results_dir, name) for name in sorted(os.listdir(results_dir))
            if os.path.isfile(os.path.join(results_dir, name, "machine.json"))}


def read_file(path):
    """``(bytes, None)`` if ``path`` is (a symlink to) a regular file it can read, else ``(None, why not)``.

    Never blocks on a FIFO: it is opened without waiting for a writer, and not read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return None, "a dangling symlink, not a regular file"
        return None, f"cannot be read ({exc.strerror})"
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        return None, f"{paths.kind(mode)}, not a regular file"
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read(), None
        except OSError as exc:
            return None, f"cannot be read ({exc.strerror})"


def machine_name(folder):
    """The ``machine`` that ``folder/machine.json`` names (asv's identity of the machine); UserError if unreadable."""
    path = os.path.join(folder, "machine.json")
    data, why = read_file(path)
    try:
        name = json.loads(data)["machine"] if data is not None else None
    except (ValueError, TypeError, KeyError, RecursionError):
        name = None
    if not isinstance(name, str) or not name:
        what = why or "no machine name in it"
        raise UserError(f"{path} is not a readable asv machine file ({what}): asv would skip this machine")
    return name


class ResultsDir:
    """asv's results directory: ``<results_dir>/<machine>/<hash8>-<env_name>.json``.

    Args:
        results_dir: path of asv's ``results_dir`` (``.asv/results`` here).
        repo_dir: git checkout used to resolve revisions such as ``HEAD~1``.
        known_param_names: benchmark -> ``param_names``, used where asv's
            ``benchmarks.json`` is missing or does not fit a result.
        also: more results directories (``--with docs/results``), whose
            machines are read beside those of ``results_dir``, each from its
            own folder, under its own name; ``results_dir`` may then be missing.
        branch: the branch the results measure (asv.conf.json's ``branches``).

    A machine is named as asv names it: by its folder's ``machine.json``
    (``"machine"``), whatever the folder is called. asv's dashboard shows a
    hand-renamed folder's results under that name, and asv reads a result file
    only if it names the same machine (``Results.load``'s ``machine_name``): so
    ``--machine``, every header and the CSV's machine column take it, and a
    result file of another machine is unreadable (:meth:`load_file`). Two folders
    naming one machine are refused, as asv would show them as one.

    Only the result files of commits on ``branch``'s history, as asv's graphs
    take it (:meth:`branch_hashes`), are read unless a commit is named: the
    newest commit, and every file the CSV reads, is one of them; the others
    (a feature branch's, or commits a reset or rebase removed) are left
    unread, with a note saying so. Where ``repo_dir`` holds no such branch,
    every file is read.

    Raises:
        UserError: a directory does not exist, none holds a machine, a machine.json cannot be read, or two
            folders hold the same machine.
    """

    def __init__(self, results_dir, repo_dir=".", known_param_names=None, also=(), branch=common.BRANCH):
        self.path = results_dir
        self.paths = [results_dir, *also]  # every directory read (no output may go into one)
        self.repo_dir = repo_dir
        self.branch = branch
        self._skipped = set()  # (machine, name) of files already reported as not regular
        self._noted = set()  # ("machine", name) and ("commit", hash8) already noted as off the branch
        self.folders = {}  # machine -> the folder its results are read from
        for i, path in enumerate(self.paths):
            if i:
                check_with_dir(path, self.paths[:i])
            elif not os.path.isdir(path):
                if also:
                    continue
                raise UserError(
                    f"no asv results directory at {path}: run the main job first "
                    "(python3 tools/dev.py bench)"
                )
            for folder in machine_folders(path).values():
                name = machine_name(folder)
                if name in self.folders:
                    raise UserError(f"machine {name!r} has results in both {self.folders[name]} and {folder} (as "
                                    "their machine.json say): a machine's results are read from one folder, never "
                                    "merged or renamed; leave one of them out")
                self.folders[name] = folder
        self.machines = sorted(self.folders)
        if not self.machines:
            raise UserError(f"{' nor '.join(map(str, self.paths))} holds no machine's results: "
                            "run the main job first")
        self.param_names = [*(self._load_param_names(path) for path in self.paths), dict(known_param_names or {})]

    @property
    def where(self):
        """The directories read, for messages: ``.asv/results`` or ``.asv/results and docs/results``."""
        return " and ".join(map(str, self.paths))

    def _load_param_names(self, results_dir):
        """benchmark name -> asv ``param_names``, from asv's ``benchmarks.json`` ({} if unusable)."""
        path = os.path.join(results_dir, "benchmarks.json")
        what = not_regular(path)
        if what:
            print(f"note: skipped {path}: {what}, not a regular file", file=sys.stderr)
            return {}
        try:
            with open(path) as f:
                benchmarks = json.load(f)
        except (OSError, ValueError, RecursionError):
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
                held = [f"folder {folder} holds machine {name!r} (its machine.json's name, asv's)"
                        for name, folder in self.folders.items() if os.path.basename(folder) == machine]
                raise UserError(
                    f"no results for machine {machine!r} in {self.where} "
                    f"(machines with results: {', '.join(self.machines)}" + "".join(f"; {h}" for h in held) + ")"
                )
            return machine
        for local in (_local_asv_machine(), _recorded_asv_machine()):
            if local in self.machines:
                return local
        if len(self.machines) == 1:
            return self.machines[0]
        raise UserError(
            f"results from several machines in {self.where} ({', '.join(self.machines)}): choose one with --machine"
        )

    @functools.cached_property
    def branch_hashes(self):
        """The hash8 of every commit of the branch's first-parent history (asv's ``get_branch_commits``,
        the commits its graphs show), or None when ``repo_dir`` is no git repository holding the branch."""
        from asv.plugins.git import Git
        from asv.util import ProcessError

        if not (Git.is_local_repo(self.repo_dir) and _git(self.repo_dir, "rev-parse", "--verify", "--quiet",
                                                          "--end-of-options", f"{self.branch}^{{commit}}")):
            return None
        try:
            return {commit[:8] for commit in Git(self.repo_dir, self.repo_dir).get_branch_commits(self.branch)}
        except ProcessError:
            return None

    def on_branch(self, name):
        """False when result file ``name`` (or a hash prefix) is of a commit not on the branch; True if it is
        or cannot be told."""
        return self.branch_hashes is None or name[:8] in self.branch_hashes

    def files(self, machine, env=None, every=False):
        """Result file names of ``machine`` (``<hash8>-<env>.json``; ``env`` a part of the env name), sorted.

        Only those of commits on the branch (:meth:`on_branch`), unless ``every``: the others are
        named in a note on stderr, once. A name that is not a regular file (a FIFO, a device, a
        directory) is skipped, with a note on stderr.
        """
        names = self._files(machine, env)
        if every:
            return names
        off = sorted({n[:8] for n in names if not self.on_branch(n)})
        if off and ("machine", machine) not in self._noted:
            self._noted.add(("machine", machine))
            listed = ", ".join(off[:5]) + (", ..." if len(off) > 5 else "")
            print(f"note: results of {len(off)} commit(s) on machine {machine!r} not read: not on {self.branch}'s "
                  f"history (a reset or rebase removed them, or another branch has them): {listed}; "
                  "name one (--commit HASH, or compare's BASE HEAD) to read it", file=sys.stderr)
        return [n for n in names if self.on_branch(n)]

    def _files(self, machine, env=None):
        folder = self.folders[machine]
        names = []
        for n in sorted(os.listdir(folder)):
            if not ((m := RESULT_FILE.match(n)) and (env is None or env in m.group(2))):
                continue
            what = not_regular(os.path.join(folder, n)) or (None if os.path.exists(os.path.join(folder, n))
                                                           else "a dangling symlink")
            if what is None:
                names.append(n)
            elif (machine, n) not in self._skipped:
                self._skipped.add((machine, n))
                print(f"note: skipped {os.path.join(folder, n)}: {what}, not a regular file", file=sys.stderr)
        return names

    def resolve(self, rev, machine):
        """``(hash8, commit)``: the prefix that names ``rev``'s result files on ``machine``, and
        what the file's commit hash must start with (git's full hash, or the hex ``rev`` itself).

        ``rev`` is any git revision (``HEAD~1``, a branch, a hash) or a hash
        prefix (at least 4 characters) of a commit that has results.

        Raises:
            UserError: ``rev`` is neither a revision nor a prefix of a commit
                with results, or the commit has no results on ``machine``.
        """
        full = _git(self.repo_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
        prefixes = {RESULT_FILE.match(n).group(1) for n in self.files(machine, every=True)}
        hash8, commit = self._resolve(rev, full, prefixes, machine)
        if not self.on_branch(hash8) and ("commit", hash8) not in self._noted:
            self._noted.add(("commit", hash8))
            print(f"note: commit {hash8} ({rev}) is not on {self.branch}'s history: its stored results are read "
                  "as asked", file=sys.stderr)
        return hash8, commit

    def _resolve(self, rev, full, prefixes, machine):
        if full:
            if full[:8] not in prefixes:
                raise UserError(
                    f"commit {full[:8]} ({rev}) has no results on machine {machine!r}: "
                    f"benchmark it with asv run {full[:8]}^! --record-samples"
                )
            return full[:8], full
        rev_lower = rev.lower()
        if re.fullmatch(r"[0-9a-f]{1,3}", rev_lower):
            raise UserError(f"commit prefix {rev!r} is too short: give at least 4 hex digits")
        matches = sorted(p for p in prefixes if re.fullmatch(r"[0-9a-f]{4,40}", rev_lower)
                         and p.startswith(rev_lower[:8]))
        if len(matches) == 1:
            return matches[0], rev_lower
        if len(matches) > 1:
            raise UserError(f"commit prefix {rev!r} is ambiguous: {', '.join(matches)}")
        raise UserError(f"unknown commit {rev!r}: not a git revision here, nor a commit with results on {machine!r}")

    def load(self, machine, hash8=None, env=None, commit=None):
        """Load one run: commit ``hash8`` (default: the newest commit with results) on ``machine``.

        ``commit``, if given, is what the run's full hash must start with.

        Raises:
            UserError: no result file matches, or several environments do and
                ``env`` does not choose one.
        """
        where = f"machine {machine!r}" + (f" in an env matching {env!r}" if env else "")
        names = self.files(machine, env, every=hash8 is not None)
        if hash8 is None:
            runs = [self.load_file(machine, n) for n in names]
            if not runs:
                mains = f" of commits on {self.branch}'s history" if self.branch_hashes is not None else ""
                raise UserError(f"no results{mains} for {where} in {self.where}")
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
        """Read ``<machine>/<name>`` (see :func:`load_run`): a result file of ``machine``, as asv reads it."""
        return load_run(os.path.join(self.folders[machine], name), self.param_names, machine)


def check_with_dir(path, earlier):
    """UserError unless ``path`` (a ``--with`` directory) is a directory of machines, none of the ``earlier``."""
    what = f"--with {path}"
    if not str(path):
        raise UserError("--with: the path is empty")
    if not os.path.isdir(path):
        kind = not_regular(path) or ("a regular file" if os.path.exists(path) else None)
        raise UserError(f"{what}: {'it is ' + kind + ', not a directory' if kind else 'no such directory'}")
    same = [p for p in earlier if os.path.isdir(p) and os.path.samefile(p, path)]
    if same:
        raise UserError(f"{what}: the same directory as {same[0]}, already read")
    if not machine_folders(path):
        raise UserError(f"{what} holds no machine's results (no <machine>/machine.json in it)")


def _local_asv_machine():
    """This host's asv machine name, :func:`tools.common.machine_name`."""
    return common.machine_name()


def _recorded_asv_machine():
    """The one machine name ``asv machine`` recorded for this host (``~/.asv-machine.json``), or None."""
    path = os.path.expanduser("~/.asv-machine.json")
    if not_regular(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    names = [k for k in data if k != "version"] if isinstance(data, dict) else []
    return names[0] if len(names) == 1 else None


def import_asv_results():
    """asv's ``Results`` and its ``UserError``; a UserError naming the fix if asv is missing."""
    try:
        from asv.results import Results
        from asv.util import UserError as AsvUserError
    except ImportError:
        raise UserError(
            "asv is not installed here: run inside .venv (source .venv/bin/activate), "
            "which either of the two commands creates"
        ) from None
    return Results, AsvUserError


def load_run(path, param_names=(), machine=None):
    """Read one asv result file into a :class:`Run`, through asv's own ``Results.load``.

    ``param_names`` is a sequence of dicts (benchmark -> names), tried in order.
    ``machine``, if given, is the machine its folder's machine.json names: the
    file must name it too, as asv requires of the files it reads.

    Raises:
        UserError: the file is not a readable, well-formed asv result file (of ``machine``).
    """
    Results, AsvUserError = import_asv_results()
    label = os.path.join(*path.split(os.sep)[-2:])
    what = not_regular(path)
    if what:
        raise UserError(f"cannot read asv result file {label}: it is {what}, not a regular file")
    try:
        results = Results.load(path)
        run = Run(
            commit=_text(results.commit_hash, "commit_hash"),
            machine=_text(results.params.get("machine", os.path.basename(os.path.dirname(path))), "machine"),
            env_name=_text(results.env_name, "env_name"),
            date=_date(results.date),
            machine_params=_machine_params(results.params),
            env_vars={str(k): str(v) for k, v in dict(results.env_vars or {}).items()},
            points={},
            measured=_measured(results),
        )
        if machine is not None and results.params.get("machine") != machine:  # params is a dict: checked above
            raise UserError(f"cannot read asv result file {label}: it is of machine "
                            f"{short(results.params.get('machine'))}, but its folder's machine.json names "
                            f"{machine!r} (asv skips such a file)")
        for name in results.get_all_result_keys():
            names = _names_for(name, results.get_result_params(name), param_names)
            for point in _points(results, name, names):
                run.points[(name, tuple(sorted(point.params.items())))] = point
    except RecursionError:
        raise UserError(f"cannot read asv result file {label}: nested too deeply") from None
    except (AsvUserError, OSError, ValueError, TypeError, AttributeError, KeyError, IndexError,
            OverflowError, MemoryError) as exc:
        reason = str(exc).replace(path, label) or type(exc).__name__
        raise UserError(f"cannot read asv result file {label}: {reason[:300]}") from None
    return run


def _measured(results):
    """When the run's last benchmark started (asv's ``started_at``, ms since the epoch), or None."""
    started = [v for v in dict(results.started_at or {}).values() if is_number(v) and 0 < v < 253402300800000]
    return max(started) if started else None


def _text(value, what):
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} is {short(value)}, not a string")
    return value


def _date(value):
    """asv's commit date: ms since the epoch, between 1970 and 9999."""
    if not is_number(value) or not 0 <= value < 253402300800000:
        raise ValueError(f"date is {short(value)}, not ms since the epoch")
    return value


COUNTS = ("ram", "num_cpu")  # machine fields that are counts: ASCII digits (or empty, unknown)


def _machine_params(params):
    """asv's machine info as strings; ValueError if a count (ram bytes, CPUs) is not a plain number."""
    if not isinstance(params, dict):
        raise ValueError(f"params is {short(params)}, not an object")
    out = {str(k): str(v) for k, v in params.items()}
    for key in COUNTS:
        if not re.fullmatch(r"[0-9]{0,20}", out.get(key, "")):
            raise ValueError(f"machine field {key} is {short(params[key])}, not a number")
    return out


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
    if not is_finite(value) or (timed and value <= 0):
        raise ValueError(f"{name}: {short(value)} is not a valid {'time' if timed else 'result'}")
    return value


def _samples(samples, name):
    if samples is None:
        return None
    if not isinstance(samples, list) or not all(is_finite(s) and s > 0 for s in samples):
        raise ValueError(f"{name}: samples must be a list of positive seconds")
    return samples


UNBOUNDED = {"ci_99_a": -math.inf, "ci_99_b": math.inf}  # asv's 99 % bounds of one sample (--quick): none


def _points(results, name, names):
    """Every parameter combination of benchmark ``name`` in ``results``, as Points."""
    params = results.get_result_params(name)
    values = results.get_result_value(name, params)
    stats = results.get_result_stats(name, params)
    samples = results.get_result_samples(name, params)
    timed = name.rsplit(".", 1)[-1].startswith("time")
    # asv keeps one entry per combination, in itertools.product order ([()] if unparameterized).
    combos = list(itertools.product(*params))
    # asv's getters pad a short column with None (a failure) and drop extra entries: check what is stored.
    stored = {"values": results._results, "statistics": results._stats, "samples": results._samples}
    for what, columns in stored.items():
        column = columns.get(name)
        if params and isinstance(column, list) and len(column) != len(combos):
            raise ValueError(f"{name}: {len(column)} {what} for {len(combos)} parameter combinations")
    for i, combo in enumerate(combos):
        stat = (stats[i] if stats and i < len(stats) else None) or {}
        if not isinstance(stat, dict) or not all(is_finite(v) or UNBOUNDED.get(k, 0) == v for k, v in stat.items()):
            raise ValueError(f"{name}: malformed statistics {short(stat)}")
        yield Point(
            benchmark=name,
            params={n: _parse_param(str(v)) for n, v in zip(names, combo)},
            value=_value(values[i] if values is not None and i < len(values) else None, name, timed),
            stats=stat,
            samples=_samples(samples[i] if samples and i < len(samples) else None, name),
        )
