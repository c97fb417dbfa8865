"""``bench``: the main job. Benchmark the commits of main that can change a result, publish, judge main's tip.

Benchmark files always come from the working tree, so only a commit that
changes what asv builds and installs (the package, its build files, asv's own
config) can change a result: those commits of main are selected, plus main
and main~1, never one the package cannot be built from. Commits that already
have results for every benchmark are skipped, so a re-run costs only what is
new; a stored timing without samples (a plain ``asv run --quick``'s) counts
as missing and is measured again. Results are stored under this machine's
name, hostname plus a hardware fingerprint (:mod:`tools.machine`), or
``--machine NAME``. The job exits 2 when a benchmark failed its correctness
check at main's tip, or a point measured at main~1 is n/a there (it vanished);
1 on an error.
"""

from .. import common, results
from .publish import VIEW_COMMAND, publish

LOCKS_WORKSPACE = True  # one job at a time in .asv/ (tools/lock.py)

RESULT_PATHS = ["kv_attention", "setup.cfg", "pyproject.toml", "asv.conf.json"]
BUILD_FILES = ["setup.cfg", "pyproject.toml", "kv_attention/__init__.py"]  # all present => buildable


def setup_arguments(subparsers):
    parser = subparsers.add_parser("bench", allow_abbrev=False,
                                   help="benchmark the commits of main that can change a result, and publish")
    parser.add_argument("--all", action="store_true",
                        help="every buildable commit of main, not only main, main~1 and those that changed "
                             + ", ".join(RESULT_PATHS))
    parser.add_argument("--machine", metavar="NAME",
                        help="asv machine name to store the results under (default: hostname plus a short "
                             "fingerprint of the CPU and /etc/machine-id)")
    return parser


def is_buildable(commit):
    """True when the commit has every file the package build needs."""
    listed = set(common.git("ls-tree", "-r", "--name-only", commit, "--", *BUILD_FILES).split())
    return listed == set(BUILD_FILES)


def select_commits(whole_history):
    """Commits of main to benchmark, newest first, never one the package cannot be built from.

    main and main~1 always, and every commit of main that changed a path of
    :data:`RESULT_PATHS`; ``whole_history`` takes every commit instead. "Of main"
    is main's first-parent history, the commits asv's graphs show: a merged
    branch counts as its merge commit, not as each of its own commits.
    """
    branch = common.BRANCH
    if whole_history:
        candidates = common.git("rev-list", "--first-parent", branch).split()
    else:
        head = common.git("rev-list", "--first-parent", "--max-count=2", branch).split()  # main, main~1
        changing = common.git("rev-list", "--first-parent", branch, "--", *RESULT_PATHS).split()
        candidates = list(dict.fromkeys(head + changing))
    commits = [c for c in candidates if is_buildable(c)]
    if not commits:
        raise common.UserError(f"no commit of {branch} has a buildable package ({', '.join(BUILD_FILES)})")
    return commits


def print_outcomes(commits, head):
    """Print one line per commit (ok / failed / skipped points); return the benchmarks that failed at ``head``."""
    conf, benchmarks, machine, env_names = results.asv_setup()
    if benchmarks is None:
        raise common.UserError("asv found no benchmarks to report on (no benchmarks.json: "
                               "did asv run discover the suite?)")
    print(f"\nresults on machine {machine!r}:")
    head_failed, head_measured = [], False
    for commit in commits:
        counts, failed = results.count_outcomes(commit, conf, benchmarks, machine, env_names)
        subject = common.git("log", "-1", "--format=%s", commit)
        status = ", ".join(f"{counts[k]} {k}" for k in ("ok", "failed", "skipped")) if counts else "no results"
        print(f"  {commit[:8]}  {status:<30}  {subject[:60]}")
        if commit == head:
            head_failed, head_measured = failed, bool(counts)
    if not head_measured:
        raise common.UserError(f"{common.BRANCH} ({head[:8]}) has no results: its build or install failed "
                               "(see above)")
    return head_failed


def run(args):
    commits = select_commits(args.all)
    common.record_machine(args.machine)
    results.quarantine_unreadable()
    conf, benchmarks, machine, env_names = results.asv_setup()
    todo = [c for c in commits if not results.has_results(c, conf, benchmarks, machine, env_names)]
    if results.drop_unsampled(conf, machine, env_names, todo):
        print("stored timings without samples (asv run --quick, or without --record-samples) are measured again")
    print(f"{len(commits)} commit(s) of {common.BRANCH} can change a result; {len(commits) - len(todo)} already "
          f"have results on this machine, benchmarking {len(todo)}", flush=True)
    if todo:
        common.asv_run(todo)
    publish()
    tip = common.git("rev-parse", common.BRANCH)
    head_failed = print_outcomes(commits, tip)
    print(f"\ndashboard written to {common.ROOT / '.asv' / 'html'}; view it with:\n  {VIEW_COMMAND}")
    return verdict(tip, head_failed)


def verdict(tip, head_failed):
    """Exit 2 naming each benchmark that failed at main's tip and each point that vanished there, else 0.

    A point vanished when it had a value at main~1 and is n/a at main
    (:func:`tools.results.vanished`; a benchmark retired in benchmarks/common.py is not).
    """
    parent = common.git("rev-list", "--first-parent", "--skip=1", "--max-count=1", tip)
    vanished = results.vanished_between(parent, tip) if parent else []
    for name in head_failed:
        print(f"FAILED at {common.BRANCH} {tip[:8]}  {name}")
    for label in vanished:
        print(f"VANISHED at {common.BRANCH} {tip[:8]}  {label}  (a value at {common.BRANCH}~1 {parent[:8]}, n/a now)")
    if vanished:
        print(results.RETIRE_HINT)
    if head_failed or vanished:
        print(f"bench: exit 2 ({len(head_failed)} benchmark(s) failed their correctness check, {len(vanished)} "
              f"point(s) vanished at {common.BRANCH})")
        return 2
    return 0
