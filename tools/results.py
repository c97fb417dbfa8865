"""The one reader of asv's result files, for every command: has-results, outcomes, comparisons, runs.

asv stores one JSON file per commit and environment under
``<results_dir>/<machine>/<hash8>-<env_name>.json``. Two views of them:

- for the main job and the gate, asv's own ``Results`` objects: whether a
  commit has results for every benchmark (:func:`has_results`), how many
  points passed, failed or were skipped (:func:`count_outcomes`), the rows
  asv's ``Compare.print_table`` reads (:func:`compare_rows`) and asv's verdict
  on two of them (:func:`head_is_worse`);
- for the report, a checked :class:`Run` of :class:`Point` values
  (:class:`ResultsDir`, :func:`load_run`).

A *point* is one benchmark at one parameter combination at one commit: the
value asv stored (the median, in seconds, for ``time_`` benchmarks; None when
the benchmark failed; NaN when it was skipped), its statistics and, when asv ran
with ``--record-samples``, every timing sample. The report's reader checks what
it reads: a value that is neither a number, null nor NaN, a time that is not
positive and finite, or malformed samples make the file unreadable (a
:class:`~tools.common.UserError`), never a figure.

asv is imported inside the functions, so that ``tools/dev.py`` can parse its
command line before ``.venv`` exists.
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

# --- asv's Results, for the main job and the gate -------------------------------------------------


def asv_setup():
    """``(conf, benchmarks or None, machine, env_names)`` of this project's asv on this machine.

    ``benchmarks`` is None before asv has discovered the suite once (no benchmarks.json);
    ``machine`` is the name :func:`common.use_machine` chose (hostname plus hardware fingerprint).
    """
    from asv.benchmarks import Benchmarks
    from asv.config import Config
    from asv.environment import get_environments
    from asv.machine import Machine
    from asv.util import UserError as AsvUserError

    conf = Config.load(str(common.ROOT / "asv.conf.json"))
    try:
        benchmarks = Benchmarks.load(conf)
    except AsvUserError:
        benchmarks = None
    env_names = {env.name for env in get_environments(conf, None, verbose=False)}
    common.use_machine()
    return conf, benchmarks, Machine.get_unique_machine_name(), env_names


def iter_results(conf, machine, commit, env_names):
    """asv's stored Results of ``commit`` on ``machine``, in the configured environments only."""
    from asv.results import iter_results_for_machine_and_hash

    for result in iter_results_for_machine_and_hash(conf.results_dir, machine, commit):
        if result.env_name in env_names:
            yield result


def unsampled(result):
    """The ``time_`` benchmarks of ``result`` with a measured point stored without samples (a --quick run's,
    or an asv run's without --record-samples): incomplete, since the gate's test needs the samples."""
    names = []
    for key in result.get_all_result_keys():
        if not key.rsplit(".", 1)[-1].startswith("time_"):
            continue
        params = result.get_result_params(key)
        values = result.get_result_value(key, params)
        samples = result.get_result_samples(key, params) or [None] * len(values)
        if any(is_number(v) and not math.isnan(v) and s is None for v, s in zip(values, samples)):
            names.append(key)
    return names


def has_results(commit, conf, benchmarks, machine, env_names):
    """True when every benchmark of the suite has a stored result for ``commit`` in every environment,
    every timing with its samples (:func:`unsampled`)."""
    if benchmarks is None:
        return False
    stored = {}
    for result in iter_results(conf, machine, commit, env_names):
        stored[result.env_name] = set(result.get_all_result_keys()) - set(unsampled(result))
    return set(stored) == env_names and all(set(benchmarks) <= keys for keys in stored.values())


def drop_unsampled(conf, machine, env_names, commits):
    """Forget the stored timings of ``commits`` that lack samples, so that ``asv run --skip-existing``
    measures them again; returns the number of result files that had any."""
    dropped = 0
    for commit in commits:
        for result in iter_results(conf, machine, commit, env_names):
            names = unsampled(result)
            for key in names:
                result.remove_result(key)
            if names:
                result.save(conf.results_dir)
                dropped += 1
    return dropped


def count_outcomes(commit, conf, benchmarks, machine, env_names):
    """``(Counter of ok / failed / skipped points, sorted names of failed benchmarks)`` asv stored for ``commit``."""
    counts, failed = Counter(), []
    for result in iter_results(conf, machine, commit, env_names):
        for key in result.get_result_keys(benchmarks):
            if key not in benchmarks:
                continue
            value = result.get_result_value(key, benchmarks[key]["params"])
            for point in value if isinstance(value, list) else [value]:
                if point is None:
                    counts["failed"] += 1
                    failed.append(key)
                elif isinstance(point, float) and math.isnan(point):
                    counts["skipped"] += 1
                else:
                    counts["ok"] += 1
    return counts, sorted(set(failed))


def selected_points(conf, result, pattern):
    """``{benchmark: [bool per parameter combination]}`` of ``result``'s benchmarks that ``--bench pattern`` selects.

    Decided by asv's own ``Benchmarks`` selection, as ``asv run --bench`` decides
    it: a parameterized benchmark's combinations by matching ``name(value1, value2)``.
    """
    from asv.benchmarks import Benchmarks

    keys = list(result.get_all_result_keys())
    params = {key: result.get_result_params(key) for key in keys}
    chosen = Benchmarks(conf, [{"name": key, "params": params[key]} for key in keys], regex=pattern)
    selection = {}
    for key in chosen:
        count = len(list(itertools.product(*params[key])))  # 1 for an unparameterized benchmark
        indices = chosen.benchmark_selection[key]
        selection[key] = [True] * count if indices is None else [i in indices for i in range(count)]
    return selection


def compare_rows(conf, results, pattern=None):
    """Rows in the form asv's ``Compare.print_table`` reads, for the benchmarks ``pattern`` selects.

    A combination the pattern does not select shows as n/a (NaN), never as a stored or failed value.
    """
    rows = []
    for result in results:
        for key, keep in selected_points(conf, result, pattern).items():
            params = result.get_result_params(key)
            columns = [result.get_result_value(key, params), result.get_result_stats(key, params),
                       result.get_result_samples(key, params)]
            value, stats, samples = ([c if k else blank for c, k in zip(column or [None] * len(keep), keep)]
                                     for column, blank in zip(columns, (math.nan, None, None)))
            rows.append((key, params, value, stats, samples, result.benchmark_version.get(key),
                         result.params["machine"], result.env_name))
    return rows


def unrolled(rows):
    """``{(benchmark(params), env): (value, (stats, samples), version)}`` of every parameter combination."""
    from asv.commands.compare import unroll_result

    points = {}
    for key, params, value, stats, samples, version, _, env_name in rows:
        for name, point, point_stats, point_samples in unroll_result(key, params, value, stats, samples):
            points[(name, env_name)] = (point, (point_stats, point_samples), version)
    return points


RETIRE_HINT = ("note: a vanished benchmark removed on purpose passes once it is declared, with the reason, "
               "in RETIRED in benchmarks/common.py")


def retired():
    """``{name: reason}`` of benchmarks deliberately removed: ``RETIRED`` in the suite's benchmarks/common.py.

    A suite without that module (a throwaway project's) has retired nothing.
    """
    try:
        from benchmarks import common as suite
    except ImportError:
        return {}
    return dict(getattr(suite, "RETIRED", {}))


def vanished(base, head, retired_names=None):
    """Sorted labels of the points that had a value at ``base`` and are n/a at ``head``.

    ``base`` and ``head`` are :func:`unrolled` points. n/a is NaN (asv's skip)
    or no stored point at all; a failure (None) at either commit is a failure,
    not a vanished point, and n/a at both stays n/a. A point whose benchmark
    name, or whose ``name(params)`` label, is a key of ``retired_names``
    (default :func:`retired`) was removed on purpose and is not reported.
    """
    if not head:  # no results at all: the commit failed to build, reported as such, not point by point
        return []
    retired_names = retired() if retired_names is None else retired_names
    labels = []
    for key, (value, _, _) in base.items():
        label = key[0]
        if value is None or math.isnan(value) or label in retired_names or label.split("(")[0] in retired_names:
            continue
        head_value = head.get(key, (math.nan,))[0]
        if head_value is not None and math.isnan(head_value):
            labels.append(label)
    return sorted(set(labels))


def vanished_between(base, head):
    """:func:`vanished` between the stored results of commits ``base`` and ``head`` on this machine."""
    conf, _, machine, env_names = asv_setup()
    base_points, head_points = (unrolled(compare_rows(conf, iter_results(conf, machine, commit, env_names)))
                                for commit in (base, head))
    return vanished(base_points, head_points)


def head_is_worse(base, head, base_stats, head_stats, factor):
    """asv compare's verdict: ``head`` worse than ``base`` by more than ``factor`` and significantly so.

    Significance is Mann-Whitney U on the stored samples, else 99 % confidence
    interval overlap: the rule of ``asv compare`` and ``asv continuous``.
    """
    # asv 0.6.6 (pinned in setup.cfg) offers this rule only as a private function of asv compare.
    from asv.commands.compare import _is_result_better

    return _is_result_better(base, head, base_stats, head_stats, factor)


def drop_partial(conf, machine, env_names, commits, pattern):
    """Forget stored benchmarks that ``--bench pattern`` measured for only some parameter combinations.

    asv stores NaN for the combinations it did not run, and ``asv run --skip-existing``
    (the main job) would then never measure them. A benchmark is dropped only when
    every combination the pattern did not select is NaN. A result file left with no
    benchmark at all is removed (asv's ``Results.rm``), never left empty: the commit
    then has no results, as before the command. Returns True if any was dropped.
    """
    dropped = False
    for commit in commits:
        for result in iter_results(conf, machine, commit, env_names):
            partial = []
            for key, keep in selected_points(conf, result, pattern).items():
                values = result.get_result_value(key, result.get_result_params(key))
                rest = [v for v, k in zip(values, keep) if not k]
                if rest and all(isinstance(v, float) and math.isnan(v) for v in rest):
                    partial.append(key)
            for key in partial:
                result.remove_result(key)
            if partial and not list(result.get_all_result_keys()):
                result.rm(conf.results_dir)
            elif partial:
                result.save(conf.results_dir)
            dropped = dropped or bool(partial)
    return dropped


def quarantine_unreadable():
    """Move aside every result file of this machine that asv cannot read; return the paths moved.

    asv writes a result file in place, so a run killed while it writes leaves a
    truncated file; asv then skips it when reading and cannot save over it, so
    its commit would never be measured again. Such a file (and any non-regular
    file where asv would read one: a FIFO would block it forever) is moved to
    ``.asv/corrupt/`` under the same relative path, with one line naming it;
    the commit then has no results and is measured again. Nothing else is touched.
    """
    from asv.config import Config
    from asv.machine import Machine
    from asv.results import Results, iter_results_paths

    results_dir = os.path.abspath(Config.load(str(common.ROOT / "asv.conf.json")).results_dir)
    folder = os.path.join(results_dir, Machine.get_unique_machine_name())
    moved = []
    for path in (os.path.join(results_dir, "benchmarks.json"), os.path.join(folder, "machine.json")):
        if not_regular(path):  # asv rewrites both; a FIFO in their place would block it
            moved.append(_move_aside(path, results_dir, f"{not_regular(path)}, not a regular file"))
    for root, filename, _ in iter_results_paths(folder):
        path = os.path.join(root, filename)
        reason = not_regular(path)
        reason = reason and f"{reason}, not a regular file"
        if not reason:
            try:
                Results.load(path)
            except Exception as exc:  # asv raises UserError, and others on odd content
                reason = str(exc).replace(path, "it").replace(filename, "it")[:200] or type(exc).__name__
        if reason:
            moved.append(_move_aside(path, results_dir, reason))
    return moved


def _move_aside(path, results_dir, reason):
    """Rename ``path`` into ``.asv/corrupt/`` (never over an earlier one) and say so; the new path."""
    target = common.ROOT / ".asv" / "corrupt" / os.path.relpath(path, results_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        if not os.path.lexists(target):
            break
        target = target.with_name(f"{Path(path).name}.{i}")
    try:
        os.rename(path, target)
    except OSError as exc:
        raise UserError(f"{path} cannot be read by asv ({reason}) nor moved aside ({exc.strerror}): "
                        "delete it, and its commit is measured again") from None
    print(f"moved unreadable result file {os.path.relpath(path, common.ROOT)} to "
          f"{os.path.relpath(target, common.ROOT)} ({reason}): its commit is measured again", flush=True)
    return target


def result_files(conf, machine, commit):
    """The path pattern of ``commit``'s result files on ``machine``: ``<results_dir>/<machine>/<hash8>-*.json``."""
    return os.path.join(os.path.relpath(conf.results_dir, common.ROOT), machine, f"{commit[:8]}-*.json")


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
    """This host's asv machine name, :func:`tools.machine.default_name`."""
    from .machine import default_name

    return default_name()


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
