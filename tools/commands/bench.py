"""``bench``: the main job. Benchmark a bounded sample of main's commits that can change a result, publish, judge main.

Benchmark files always come from the working tree, so only a commit that
changes what asv builds and installs (the package, its build files, asv's own
config) can change a result. Of those commits of main the job takes a bounded,
stable sample (:func:`sample_commits`): main, main~1 and the newest ones
always, older ones spread over the whole history, never one the package cannot
be built from; ``--all`` takes every commit and ``--commits N`` sets the bound.
Commits that already have results for every benchmark are skipped, so a
re-run costs only what is new; a stored timing without samples (a plain
``asv run --quick``'s) counts as missing and is measured again. One line per
commit says which of how many it is measuring and roughly how long is left.
Results are stored under this machine's name, hostname plus a hardware
fingerprint (:mod:`tools.machine`), or ``--machine NAME``. The job exits 2
when a benchmark failed its correctness check at main's tip, or a point
measured at main~1 is n/a there (it vanished); 1 on an error.
"""

import argparse
import math
import re
import time

from .. import common, machine, results
from .gate import DEFAULT_FACTOR, UNPAIRED_FACTOR, channel_summary, pair_timings
from .publish import publish, view_lines

LOCKS_WORKSPACE = True  # one job at a time in .asv/ (tools/lock.py)

RESULT_PATHS = ["kv_attention", "setup.cfg", "pyproject.toml", "asv.conf.json"]
BUILD_FILES = ["setup.cfg", "pyproject.toml", "kv_attention/__init__.py"]  # all present => buildable
# Commits the default selection benchmarks at most, so that a fresh clone's main job stays within 15 minutes:
# the suite measured 89 s of benchmarks a commit on a quiet 2-core machine, 95 s with its install
# (docs/benchmarking.md, "Cost per commit"), so 5 fit beside the .venv and the first asv environment.
DEFAULT_COMMITS = 5
NEWEST = 2  # main and main~1: always in the sample
SECONDS_PER_COMMIT = 100  # the estimate of the time left until one commit has been measured
ASV_COMMIT_LINE = re.compile(r"For \S+ commit ([0-9a-f]{8})")  # asv run's line as it starts a commit


def commit_count(text):
    """argparse type: an integer >= 2 (main and main~1)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 2 (main and main~1), got {text!r}")
    return value


def setup_arguments(subparsers):
    parser = subparsers.add_parser("bench", allow_abbrev=False,
                                   help="benchmark a bounded sample of the commits of main that can change a "
                                        "result, and publish")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true",
                       help="every buildable commit of main, not only a sample of main, main~1 and those that "
                            "changed " + ", ".join(RESULT_PATHS))
    which.add_argument("--commits", type=commit_count, default=DEFAULT_COMMITS, metavar="N",
                       help=f"benchmark at most N commits: main, main~1, the newest that can change a result and "
                            f"older ones spread over the history (default {DEFAULT_COMMITS})")
    parser.add_argument("--machine", metavar="NAME", type=machine.name_argument,
                        help="asv machine name to store the results under (default: hostname plus a short "
                             "fingerprint of the CPU and /etc/machine-id)")
    return parser


def is_buildable(commit):
    """True when the commit has every file the package build needs."""
    listed = set(common.git("ls-tree", "-r", "--name-only", commit, "--", *BUILD_FILES).split())
    return listed == set(BUILD_FILES)


def select_commits(whole_history, bound=None):
    """Commits of main to benchmark, newest first, never one the package cannot be built from.

    main and main~1 always, and the commits of main that changed a path of
    :data:`RESULT_PATHS`: all of them, or with ``bound`` the sample
    :func:`sample_commits` takes; ``whole_history`` takes every commit instead.
    "Of main" is main's first-parent history, the commits asv's graphs show: a
    merged branch counts as its merge commit, not as each of its own commits.
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
    return commits if whole_history or bound is None else sample_commits(commits, bound)


def sample_commits(commits, bound):
    """At most ``bound`` of ``commits`` (newest first): the NEWEST newest, then older ones spread evenly.

    The older ones are those at every ``stride``-th place counted from the
    oldest commit (so the first commit is always in), ``stride`` the smallest
    power of two that fits the bound. The sample is stable as history grows: a
    new commit on main changes which older commits are taken only when the
    stride doubles, and then the new ones are a subset of the old ones, so a
    re-run measures just the new commit (asv's ``--steps`` spreads its commits
    the same way, but re-spreads them as history grows).
    """
    newest, older = commits[:min(NEWEST, bound)], commits[NEWEST:][::-1]  # older: oldest first
    room = bound - len(newest)
    if room <= 0 or not older:
        return newest
    stride = 1
    while math.ceil(len(older) / stride) > room:
        stride *= 2
    spread = set(older[::stride])
    return newest + [c for c in commits[NEWEST:] if c in spread]


NAMED = 5  # points named under a summary line, per channel


def print_outcomes(commits, head, pair_tip=False):
    """Print one line per commit (ok / failed / skipped points) and the points behind its channels; return the
    benchmarks that failed at ``head``.

    Each commit is compared with the next older commit listed: counts (work) beyond the gate's count factor,
    timings (time) on asv's unpaired medians at the gate's unpaired factor, except for ``head`` against
    the commit before it when ``pair_tip``: its timings are measured again in pairs (:mod:`tools.pairs`),
    as the gate does.
    """
    conf, benchmarks, machine, env_names = results.asv_setup()
    if benchmarks is None:
        raise common.UserError("asv found no benchmarks to report on (no benchmarks.json: "
                               "did asv run discover the suite?)")
    head_failed, head_measured = [], False
    rows = [results.compare_rows(conf, results.iter_results(conf, machine, c, env_names)) for c in commits]
    paired, older_tip = None, next((c for c, r in zip(commits[1:], rows[1:]) if r), None)
    if pair_tip and commits[0] == head and rows[0] and older_tip:
        paired, _ = pair_timings(conf, benchmarks, {"base": older_tip, "head": head},
                                 {"base": rows[commits.index(older_tip)], "head": rows[0]})
    print(f"\nresults on machine {machine!r} (work: counts vs the next older commit listed; time: timings vs it, "
          f"asv's unpaired medians beyond {UNPAIRED_FACTOR}x"
          + (f", {head[:8]}'s in pairs beyond {DEFAULT_FACTOR}x" if paired else "") + "):")
    for i, commit in enumerate(commits):
        counts, failed = results.count_outcomes(commit, conf, benchmarks, machine, env_names)
        subject = common.git("log", "-1", "--format=%s", commit)
        status = ", ".join(f"{counts[k]} {k}" for k in ("ok", "failed", "skipped")) if counts else "no results"
        older = next((r for r in rows[i + 1:] if r), None)
        channels, points = "work -, time -", []
        if rows[i] and older:
            factor = DEFAULT_FACTOR if paired and i == 0 else UNPAIRED_FACTOR
            channels, points = channel_summary(older, rows[i], benchmarks, factor, paired=paired if i == 0 else None)
        print(f"  {commit[:8]}  {status:<28}  {channels:<36}  {subject[:50]}")
        for channel in ("work", "time"):
            named = [(label, ratio) for c, label, ratio in points if c == channel]
            for label, ratio in named[:NAMED]:
                print(f"      {channel} worse {ratio:.4f}x  {label}")
            if len(named) > NAMED:
                print(f"      {channel}: and {len(named) - NAMED} more")
        if commit == head:
            head_failed, head_measured = failed, bool(counts)
    if not head_measured:
        raise common.UserError(f"{common.BRANCH} ({head[:8]}) has no results: its build or install failed "
                               "(see above)")
    print(f"this summary is not a gate: the job exits 2 only for a failed correctness check or a vanished point at "
          f"{common.BRANCH}. The gate is `python3 tools/dev.py gate {common.BRANCH}~1 {common.BRANCH}` (exit 0, 1 "
          "or 2; its timings in pairs)")
    return head_failed


class Progress:
    """One line per commit as asv starts it: which of how many, and roughly how long is left."""

    def __init__(self, commits):
        self.commits, self.started, self.done = commits, time.monotonic(), 0
        self.subjects = {c[:8]: common.git("log", "-1", "--format=%s", c) for c in commits}

    def __call__(self, line):
        match = ASV_COMMIT_LINE.search(line)
        if not match or match.group(1) not in self.subjects:
            return
        elapsed = time.monotonic() - self.started
        per_commit = elapsed / self.done if self.done else SECONDS_PER_COMMIT
        left = per_commit * (len(self.commits) - self.done)
        self.done += 1
        print(f"[bench] commit {self.done} of {len(self.commits)}: {match.group(1)} "
              f"{self.subjects[match.group(1)][:50]!r}; about {format_minutes(left)} left", flush=True)


def format_minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def run(args):
    commits = select_commits(args.all, None if args.all else args.commits)
    common.record_machine(args.machine)
    results.quarantine_unreadable()
    conf, benchmarks, machine, env_names = results.asv_setup()
    todo = [c for c in commits if not results.has_results(c, conf, benchmarks, machine, env_names)]
    if results.drop_unsampled(conf, machine, env_names, todo):
        print("stored timings without samples (asv run --quick, or without --record-samples) are measured again")
    print(f"{len(commits)} commit(s) of {common.BRANCH} selected (of those that can change a result: "
          f"{'all' if args.all else f'at most {args.commits}'}); {len(commits) - len(todo)} already have results "
          f"on this machine, benchmarking {len(todo)}", flush=True)
    if todo:
        started = time.monotonic()
        common.asv_run(todo, progress=Progress(todo))
        print(f"[bench] {len(todo)} commit(s) measured in {format_minutes(time.monotonic() - started)}", flush=True)
    publish()
    tip = common.git("rev-parse", common.BRANCH)
    head_failed = print_outcomes(commits, tip, pair_tip=tip in todo)
    print(f"\n{view_lines(common.ROOT / '.asv' / 'html')}")
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
