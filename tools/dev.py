#!/usr/bin/env python3
"""The project's commands, for a fresh machine with Python >= 3.10, git and pip.

    python3 tools/dev.py bench [--all]   benchmark the commits of main that can change a result, publish the dashboard
    python3 tools/dev.py gate BASE HEAD [--factor F] [--bench REGEX]
                                         benchmark two commits where needed, compare, exit 0/1/2
    python3 tools/dev.py test [ARGS]     run python -m pytest tests (ARGS go to pytest)
    python3 tools/dev.py report ARGS     python -m benchmarks.report ARGS: the lab's tables, csv, plots

Each first makes ``.venv`` and installs the project with its test, bench and
browser extras there (again only when setup.cfg or pyproject.toml change),
then re-runs itself inside it. asv builds its own per-commit virtualenvs
under .asv/env.

Exit codes of ``gate``: 0 nothing got worse beyond the factor; 1 something did
(each named with its ratio); 2 a benchmark failed or a commit has no results
(did not build), also when something got worse too, or the command line or a
commit name was wrong.
"""

import argparse
import hashlib
import itertools
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
BRANCH = "main"
# Benchmark files always come from the working tree, so only a commit that changes
# what asv builds and installs (the package, its build files, asv's own config) can
# change a result.
RESULT_PATHS = ["kv_attention", "setup.cfg", "pyproject.toml", "asv.conf.json"]
# The smallest factor this suite's measured A/A noise supports on a quiet 2-core machine: the worst
# ratio between two runs of identical code was 1.08 (README, "Catching regressions").
DEFAULT_FACTOR = 1.10
# peakmem_ benchmarks (a process's peak RSS, one value, no samples) drifted by 11-13 % between
# separate asv runs of identical code, so they count as a regression only beyond this factor.
PEAKMEM_FACTOR = 1.25
BUILD_FILES = ["setup.cfg", "pyproject.toml", "kv_attention/__init__.py"]  # all present => buildable
INSIDE_VENV = "KV_ATTENTION_DEV_VENV"


class JobError(Exception):
    """A failure worth one line to the user, not a traceback."""


def venv_python():
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv():
    """Create .venv and install ``.[test,bench,browser]`` into it when missing or out of date."""
    if not venv_python().exists():  # missing, or left by a Python that is gone: (re)make it
        print(f"creating {VENV.relative_to(ROOT)} ...", flush=True)
        if subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)]).returncode != 0:
            raise JobError(f"python -m venv failed; on Debian/Ubuntu install python3-venv, or delete {VENV}")
    stamp = VENV / "kv-attention-installed"
    digest = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in ("setup.cfg", "pyproject.toml"))).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    print("installing kv_attention[test,bench,browser] into .venv ...", flush=True)
    pip = [str(venv_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if subprocess.run(pip + ["-e", f"{ROOT}[test,bench,browser]"]).returncode != 0:
        raise JobError("pip install of the project's test/bench dependencies failed (see above)")
    stamp.write_text(digest)


def run(*command, check=True):
    """Run a command from the repository root; JobError if it fails and ``check``."""
    result = subprocess.run(command, cwd=ROOT)
    if check and result.returncode != 0:
        raise JobError(f"`{' '.join(command)}` exited {result.returncode}")
    return result.returncode


def git(*args):
    """Stdout of ``git ARGS`` in the repository, stripped; JobError if git fails."""
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise JobError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def is_buildable(commit):
    """True when the commit has every file the package build needs."""
    listed = set(git("ls-tree", "-r", "--name-only", commit, "--", *BUILD_FILES).split())
    return listed == set(BUILD_FILES)


def select_commits(whole_history):
    """Commits of main to benchmark, newest first, never one the package cannot be built from.

    main and main~1 always, and every commit of main that changed a path of
    :data:`RESULT_PATHS`; ``whole_history`` takes every commit instead. "Of main"
    is main's first-parent history, the commits asv's graphs show: a merged
    branch counts as its merge commit, not as each of its own commits.
    """
    if whole_history:
        candidates = git("rev-list", "--first-parent", BRANCH).split()
    else:
        head = git("rev-list", "--first-parent", "--max-count=2", BRANCH).split()  # main, main~1
        changing = git("rev-list", "--first-parent", BRANCH, "--", *RESULT_PATHS).split()
        candidates = list(dict.fromkeys(head + changing))
    commits = [c for c in candidates if is_buildable(c)]
    if not commits:
        raise JobError(f"no commit of {BRANCH} has a buildable package ({', '.join(BUILD_FILES)})")
    return commits


def asv_setup():
    """``(conf, benchmarks or None, machine, env_names)`` of this project's asv on this machine.

    ``benchmarks`` is None before asv has discovered the suite once.
    """
    from asv.benchmarks import Benchmarks
    from asv.config import Config
    from asv.environment import get_environments
    from asv.machine import Machine
    from asv.util import UserError

    conf = Config.load(str(ROOT / "asv.conf.json"))
    try:
        benchmarks = Benchmarks.load(conf)
    except UserError:
        benchmarks = None
    env_names = {env.name for env in get_environments(conf, None, verbose=False)}
    return conf, benchmarks, Machine.get_unique_machine_name(), env_names


def has_results(commit, conf, benchmarks, machine, env_names):
    """True when every benchmark of the suite has a stored result for ``commit`` in every environment."""
    if benchmarks is None:
        return False
    stored = {}
    for result in iter_results(conf, machine, commit, env_names):
        stored[result.env_name] = set(result.get_all_result_keys())
    return set(stored) == env_names and all(set(benchmarks) <= keys for keys in stored.values())


def iter_results(conf, machine, commit, env_names):
    """asv's stored Results of ``commit`` on ``machine``, in the configured environments only."""
    from asv.results import iter_results_for_machine_and_hash

    for result in iter_results_for_machine_and_hash(conf.results_dir, machine, commit):
        if result.env_name in env_names:
            yield result


def count_outcomes(commit, conf, benchmarks, machine, env_names):
    """Counter of ok / failed / skipped benchmark points asv stored for ``commit``."""
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


def report(commits, head):
    """Print one line per commit; return the benchmarks that failed at ``head``."""
    conf, benchmarks, machine, env_names = asv_setup()
    if benchmarks is None:
        raise JobError("asv found no benchmarks to report on (no benchmarks.json: did asv run discover the suite?)")
    print(f"\nresults on machine {machine!r}:")
    head_failed, head_measured = [], False
    for commit in commits:
        counts, failed = count_outcomes(commit, conf, benchmarks, machine, env_names)
        subject = git("log", "-1", "--format=%s", commit)
        status = ", ".join(f"{counts[k]} {k}" for k in ("ok", "failed", "skipped")) if counts else "no results"
        print(f"  {commit[:8]}  {status:<30}  {subject[:60]}")
        if commit == head:
            head_failed, head_measured = failed, bool(counts)
    if not head_measured:
        raise JobError(f"{BRANCH} ({head[:8]}) has no results: its build or install failed (see above)")
    return head_failed


def record_machine(asv):
    """``asv machine --yes``: store this machine's defaults (hostname, CPU, RAM) without questions."""
    from asv.machine import Machine

    result = subprocess.run([*asv, "machine", "--yes"], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise JobError(f"asv machine --yes failed: {result.stderr.strip() or result.stdout.strip()}")
    info = Machine.get_defaults()
    print(f"machine {info['machine']!r}: {info['cpu']}, {info['num_cpu']} CPUs, {info['os']}", flush=True)


def asv_run(asv, commits, *options):
    """``asv run`` over ``commits`` (a HASHFILE), skipping benchmarks already stored; asv's exit code."""
    hashfile = ROOT / ".asv" / "commits-to-run.txt"
    hashfile.parent.mkdir(exist_ok=True)
    hashfile.write_text("\n".join(commits) + "\n")
    return run(*asv, "run", f"HASHFILE:{hashfile}", "--skip-existing", "--record-samples", *options, check=False)


def publish(asv):
    """``asv publish``, then local copies of the page's JavaScript where npm is present."""
    run(*asv, "publish")
    sys.path.insert(0, str(ROOT / "tools"))
    import offline_dashboard

    try:
        count = offline_dashboard.vendor(ROOT / ".asv" / "html")
        print(f"dashboard made offline-ready: its {count} external files are served from .asv/html/vendor")
    except offline_dashboard.VendorError as error:
        print(f"dashboard keeps asv's CDN links (needs internet to render): {error}")


def bench(args):
    """The main job: record the machine, benchmark the commits that can change a result, publish, judge main's tip."""
    asv = (sys.executable, "-m", "asv")
    commits = select_commits(args.all)
    record_machine(asv)
    conf, benchmarks, machine, env_names = asv_setup()
    todo = [c for c in commits if not has_results(c, conf, benchmarks, machine, env_names)]
    print(f"{len(commits)} commit(s) of {BRANCH} can change a result; {len(commits) - len(todo)} already have "
          f"results on this machine, benchmarking {len(todo)}", flush=True)
    if todo:
        asv_run(asv, todo)
    publish(asv)
    head_failed = report(commits, git("rev-parse", BRANCH))
    print(f"\ndashboard written to {ROOT / '.asv' / 'html'}; view it on 127.0.0.1 with:\n"
          "  .venv/bin/python -m http.server --bind 127.0.0.1 --directory .asv/html 8080")
    if head_failed:
        raise JobError(f"{len(head_failed)} benchmark(s) failed their gate at {BRANCH}: {', '.join(head_failed)}")


def selected(pattern, key, params):
    """Which parameter combinations of ``key`` asv's ``--bench pattern`` selects: a list of bools.

    As ``asv run --bench``: the whole benchmark when the pattern matches its name, else the
    combinations whose ``name(value1, value2)`` it matches.
    """
    combos = list(itertools.product(*params))
    if not pattern or re.search(pattern, key):
        return [True] * len(combos)
    return [bool(params) and re.search(pattern, f"{key}({', '.join(c)})") is not None for c in combos]


def compare_rows(results, pattern=None):
    """Rows in the form asv's ``Compare.print_table`` reads, for the benchmarks ``pattern`` selects.

    A combination the pattern does not select shows as n/a (NaN), never as a stored or failed value.
    """
    rows = []
    for result in results:
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            keep = selected(pattern, key, params)
            if not any(keep):
                continue
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


def judge(base_rows, head_rows, factor):
    """asv compare's verdict per benchmark: ``(regressions, failures)``.

    regressions: ``[(name, ratio head/base)]`` where head is worse than base by
    more than ``factor`` (for ``peakmem_`` benchmarks, at least PEAKMEM_FACTOR)
    and asv's statistics (Mann-Whitney U on the stored samples, else 99 %
    confidence-interval overlap) call it significant, the rule of
    ``asv compare``/``asv continuous``. failures: ``[(name, commit role)]``
    where a stored value is None (a failed benchmark or gate).
    """
    from asv.commands.compare import _is_result_better

    base, head = unrolled(base_rows), unrolled(head_rows)
    regressions, failures = [], []
    for name in sorted(set(base) | set(head)):
        label = name[0]
        (value_1, ss_1, version_1), (value_2, ss_2, version_2) = (
            points.get(name, (math.nan, None, None)) for points in (base, head))
        failures += [(label, role) for role, value in (("base", value_1), ("head", value_2)) if value is None]
        if value_1 is None or value_2 is None or math.isnan(value_1) or math.isnan(value_2):
            continue
        if version_1 is not None and version_2 is not None and version_1 != version_2:
            continue  # benchmark code changed: asv marks it x, not comparable
        peakmem = label.split("(")[0].rsplit(".", 1)[-1].startswith("peakmem_")
        if _is_result_better(value_1, value_2, ss_1, ss_2, max(factor, PEAKMEM_FACTOR) if peakmem else factor):
            regressions.append((label, value_2 / value_1 if value_1 else math.inf))
    return regressions, failures


def head_files(conf, machine, commit):
    """The path pattern of ``commit``'s result files on ``machine``: ``<results_dir>/<machine>/<hash8>-*.json``."""
    return os.path.join(os.path.relpath(conf.results_dir, ROOT), machine, f"{commit[:8]}-*.json")


def drop_partial(conf, machine, env_names, commits, pattern):
    """Forget stored benchmarks that ``--bench pattern`` measured for only some parameter combinations.

    asv stores NaN for the combinations it did not run, and ``asv run --skip-existing``
    (the main job) would then never measure them. A benchmark is dropped only when
    every combination the pattern did not select is NaN. Returns True if any was.
    """
    dropped = False
    for commit in commits:
        for result in iter_results(conf, machine, commit, env_names):
            partial = []
            for key in result.get_all_result_keys():
                params = result.get_result_params(key)
                keep = selected(pattern, key, params)
                values = result.get_result_value(key, params)
                rest = [v for v, k in zip(values, keep) if not k]
                if rest and all(isinstance(v, float) and math.isnan(v) for v in rest):
                    partial.append(key)
            for key in partial:
                result.remove_result(key)
            if partial:
                result.save(conf.results_dir)
                dropped = True
    return dropped


def resolve(name):
    """The full hash of commit ``name``; JobError naming it if there is no such commit."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    except JobError:
        raise JobError(f"{name!r} is not a commit of this repository") from None


def gate(args):
    """Benchmark BASE and HEAD where they lack results, print asv's comparison, return 0, 1 or 2."""
    from asv.commands.compare import Compare

    asv = (sys.executable, "-m", "asv")
    commits = {role: resolve(name) for role, name in (("base", args.base), ("head", args.head))}
    if commits["base"] == commits["head"]:
        print(f"note: BASE and HEAD are the same commit {commits['head'][:8]}: the comparison is of its "
              "results with themselves")
    record_machine(asv)
    asv_run(asv, list(dict.fromkeys(commits.values())), *(["--bench", args.bench] if args.bench else []))
    conf, _, machine, env_names = asv_setup()
    rows = {role: compare_rows(iter_results(conf, machine, commit, env_names), args.bench)
            for role, commit in commits.items()}
    missing = [role for role in commits if not rows[role]]
    for role in missing:
        print(f"\n{role} {commits[role][:8]} has no results on {machine!r}: it did not build or install "
              "(see asv's output above), or --bench matched nothing")
    if not missing:
        print(f"\nasv compare, factor {args.factor}:")
        Compare.print_table(conf, commits["base"], commits["head"], factor=args.factor, split=True,
                            resultset_1=iter(rows["base"]), resultset_2=iter(rows["head"]), machine=machine,
                            commit_names={c: name for c, name in zip(commits.values(), (args.base, args.head))})
    regressions, failures = judge(rows["base"], rows["head"], args.factor)
    if args.bench and drop_partial(conf, machine, env_names, set(commits.values()), args.bench):
        print("note: results of benchmarks measured here for only some parameter combinations were not kept, "
              "so that the main job measures them whole")
    for label, ratio in regressions:
        print(f"REGRESSION {ratio:.2f}x  {label}")
    for label, role in failures:
        print(f"FAILED at {role} {commits[role][:8]}  {label}")
    if missing or failures:
        print(f"gate: exit 2 ({len(failures)} failed benchmark point(s), {len(missing)} commit(s) without results, "
              f"{len(regressions)} regression(s) beyond {args.factor}x)")
        return 2
    if regressions:
        print(f"gate: exit 1 ({len(regressions)} benchmark point(s) slower than {args.factor}x and significant)")
        print(f"to check it is not noise, measure HEAD again: delete {head_files(conf, machine, commits['head'])} "
              f"and re-run this gate (on a machine shared with other jobs, use --factor 1.25)")
        return 1
    print(f"gate: exit 0 (nothing worse than {args.factor}x)")
    return 0


def test(args):
    return run(sys.executable, "-m", "pytest", "tests", *args.rest, check=False)


def report_command(args):
    """``python -m benchmarks.report ARGS`` inside .venv: the lab's tables, compare, csv, plots."""
    return run(sys.executable, "-m", "benchmarks.report", *args.rest, check=False)


def factor(text):
    """argparse type: a finite float > 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 1 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 1, got {text!r}")
    return value


def bench_regex(text):
    """argparse type: a valid regular expression."""
    try:
        re.compile(text)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"not a regular expression ({error}): {text!r}") from None
    return text


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="tools/dev.py", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    bench_parser = commands.add_parser("bench", allow_abbrev=False,
                                       help="benchmark the commits of main that can change a result, and publish")
    bench_parser.add_argument("--all", action="store_true",
                              help="every buildable commit of main, not only main, main~1 and those that changed "
                                   + ", ".join(RESULT_PATHS))
    gate_parser = commands.add_parser("gate", allow_abbrev=False,
                                      help="compare two commits; exit 0 (no regression), 1 (regression), 2 (failure)")
    gate_parser.add_argument("base", metavar="BASE", help="the reference commit (e.g. HEAD~1 or main)")
    gate_parser.add_argument("head", metavar="HEAD", help="the commit under test (e.g. HEAD)")
    gate_parser.add_argument("--factor", type=factor, default=DEFAULT_FACTOR,
                             help=f"flag a benchmark when HEAD is slower than BASE by more than this ratio and "
                                  f"asv finds the difference significant (default {DEFAULT_FACTOR})")
    gate_parser.add_argument("--bench", type=bench_regex, metavar="REGEX",
                             help="only benchmarks whose name matches REGEX (asv run --bench)")
    commands.add_parser("test", add_help=False,  # so that `test --help` shows pytest's help
                        help="run python -m pytest tests; further arguments go to pytest")
    commands.add_parser("report", add_help=False,  # `report --help` shows the report's help
                        help="python -m benchmarks.report ARGS (tables, compare, csv, plots) inside .venv")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("test", "report"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.rest = extra
    return args


COMMANDS = {"bench": bench, "gate": gate, "test": test, "report": report_command}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if os.environ.get(INSIDE_VENV) != "1":
            ensure_venv()
            os.environ[INSIDE_VENV] = "1"
            os.execv(str(venv_python()), [str(venv_python()), str(Path(__file__).resolve()), *argv])
        os.chdir(ROOT)
        return COMMANDS[args.command](args) or 0
    except JobError as error:
        print(f"tools/dev.py {args.command}: error: {error}", file=sys.stderr)
        return 2 if args.command == "gate" else 1  # gate: 1 means a regression, never an error
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
