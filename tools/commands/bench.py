"""``bench``: the main job. Benchmark a bounded sample of main's commits that can change a result, publish, summarise.

Benchmark files come from the working tree, so only a commit that changes what asv builds (the package, its build
files, asv's config) can change a result. Of those commits of main the job takes a bounded, stable sample
(:func:`sample_commits`); ``--all`` takes every commit. It runs ``asv machine --yes --machine NAME`` (NAME: the
hostname and a hardware fingerprint, or ``--machine``), ``asv run --record-samples --skip-existing`` over the
commits without complete results (a timing stored without samples counts as missing), ``asv publish`` and the
offline copies of the dashboard's scripts (:mod:`tools.commands.publish`). Its summary compares main with the
newest older commit that has results, both named: the counts by the gate's factor, the timings by ``asv compare``
on asv's samples, and each timing asv flags measured again in pairs, as the gate does. Exit 2 when a benchmark
failed at main or a point measured at main~1 is n/a there (it vanished); 1 on an error.
"""

import argparse
import math
import re
import time

from .. import common, results
from . import publish
from .gate import (COUNT_FACTOR, DEFAULT_FACTOR, UNPAIRED_FACTOR, VANISHED, asv_compare, exact_regressions, failures,
                   method_of, pair, ratio_text)

LOCKS_WORKSPACE = True
RESULT_PATHS = ["kv_attention", "setup.cfg", "pyproject.toml", "asv.conf.json"]
BUILD_FILES = ["setup.cfg", "pyproject.toml", "kv_attention/__init__.py"]  # all present => buildable
DEFAULT_COMMITS = 5  # 5 x ~100 s beside the .venv and the first asv environment: a fresh clone within 12 min
NEWEST = 2  # main and main~1: always in the sample
# Seconds of each phase, for the time left (measured on the 2-core VM, docs/benchmarking.md): a commit's build,
# install and suite; the first asv environment; asv publish with the offline copies; one timing point in pairs.
SECONDS_PER_COMMIT, FIRST_ENV, PUBLISH, PER_PAIRED_POINT = 100, 60, 20, 8
ASV_COMMIT_LINE = re.compile(r"For \S+ commit ([0-9a-f]{8})")  # asv run's line as it starts a commit
NAMED = 5  # points named under the summary, per channel


def commit_count(text):
    """argparse type: an integer >= 2 (main and main~1)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 2 (main and main~1), got {text!r}")
    return value


def machine_name(text):
    """argparse type of ``--machine``: one plain folder name (asv stores the results in ``<results_dir>/<name>/``)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", text):
        raise argparse.ArgumentTypeError(f"must be letters, digits, '.', '_' or '-', not starting with '.' (it names "
                                         f"a folder of the results), got {text!r}")
    return text


def setup_arguments(subparsers):
    parser = subparsers.add_parser("bench", allow_abbrev=False, help="benchmark a bounded sample of the commits of "
                                   "main that can change a result, publish, summarise")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every buildable commit of main")
    which.add_argument("--commits", type=commit_count, default=DEFAULT_COMMITS, metavar="N",
                       help=f"at most N commits: main, main~1, the newest that can change a result and older ones "
                            f"spread over the history (default {DEFAULT_COMMITS})")
    parser.add_argument("--machine", metavar="NAME", type=machine_name,
                        help="asv machine name (default: hostname plus a fingerprint of the hardware)")
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


def minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


class Progress:
    """One line per commit as asv starts it: which of how many, and the time left for every phase still to come."""

    def __init__(self, commits, after):
        self.commits, self.after, self.started, self.done = commits, after, time.monotonic(), 0
        self.subjects = {c[:8]: common.git("log", "-1", "--format=%s", c) for c in commits}

    def __call__(self, line):
        match = ASV_COMMIT_LINE.search(line)
        if not match or match.group(1) not in self.subjects:
            return
        elapsed = time.monotonic() - self.started
        per_commit = elapsed / self.done if self.done else SECONDS_PER_COMMIT
        left = per_commit * (len(self.commits) - self.done) + self.after
        self.done += 1
        print(f"[bench] commit {self.done} of {len(self.commits)}: {match.group(1)} "
              f"{self.subjects[match.group(1)][:50]!r}; about {minutes(left)} left (publish and pairs included)",
              flush=True)


def describe(commit, name):
    return f"{name} {commit[:8]} {common.git('log', '-1', '--format=%s', commit)[:50]!r}"


def summary(machine, commits, tip, measured):
    """Print each commit's outcomes and main against the newest older commit with results; the failures at main."""
    stored = {c: results.stored(machine, c) for c in commits}
    print(f"\nresults on machine {machine!r}:")
    for commit in commits:
        counts, _ = results.outcomes(stored[commit])
        status = ", ".join(f"{counts[k]} {k}" for k in ("ok", "failed", "skipped")) if counts else "no results"
        print(f"  {commit[:8]}  {status:<28}  {common.git('log', '-1', '--format=%s', commit)[:60]}")
    if not stored[tip]:
        raise common.UserError(f"{common.BRANCH} ({tip[:8]}) has no results: its build or install failed (see above)")
    older = next((c for c in commits[1:] if stored[c]), None)
    if older:
        base, head = stored[older], stored[tip]
        print(f"\n{describe(tip, common.BRANCH)} against {describe(older, 'the older')}:")
        flagged = [label for label in asv_compare(older, tip, machine, UNPAIRED_FACTOR)
                   if method_of(label).startswith("time_")]
        work = exact_regressions(base, head, COUNT_FACTOR)
        time_worse = []
        if flagged and tip in measured:  # asv's samples flag these: the gate's pairs confirm or clear each
            from .. import pairs

            paired, _ = pair(next(iter(pairs.environments())), {"base": older, "head": tip}, flagged, base, head,
                             DEFAULT_FACTOR)
            time_worse = [(label, p.ratio) for label, p in paired.items() if p.worse(DEFAULT_FACTOR)]
        counts = [w for w in work if w[2] == "work"]
        print(f"summary, {tip[:8]} against {older[:8]}: work {len(counts)} worse, other values "
              f"{len(work) - len(counts)} worse, time {len(time_worse)} worse"
              + (f" of {len(flagged)} asv compare flagged, timed again in pairs" if flagged and tip in measured else
                 f" in pairs; asv compare flagged {len(flagged)}, measured in an earlier run: the gate pairs them"
                 if flagged else ""))
        for label, ratio in [(label, ratio) for label, ratio, _ in work][:NAMED] + time_worse[:NAMED]:
            print(f"      worse {ratio_text(ratio)}  {label}")
    print(f"this summary is not a gate: the gate is `python3 tools/dev.py gate {common.BRANCH}~1 {common.BRANCH}`")
    parent = common.git("rev-list", "--first-parent", "--skip=1", "--max-count=1", tip)
    return failures(results.stored(machine, parent) if parent else {}, stored[tip])


def verdict(tip, failed):
    """Exit 2 naming each point that failed at main's tip or vanished there since main~1, else 0."""
    failed = [(label, role) for label, role in failed if role == "head"]
    for label, _ in failed:
        print(f"{'VANISHED' if label.endswith(VANISHED) else 'FAILED'} at {common.BRANCH} {tip[:8]}  {label}")
    if any(label.endswith(VANISHED) for label, _ in failed):
        print(results.RETIRE_HINT)
    if failed:
        print(f"bench: exit 2 ({len(failed)} point(s) failed or vanished at {common.BRANCH})")
        return 2
    return 0


def run(args):
    commits = select_commits(args.all, None if args.all else args.commits)
    machine = common.record_machine(args.machine)
    results.quarantine_unreadable(machine)
    results.forget(machine, commits, lambda points: not any(  # a timing without samples is measured again
        method_of(label).startswith("time_") and results.is_measured(p.value) and p.samples is None
        for label, p in points.items()))
    benchmarks = results.suite()
    todo = [c for c in commits if not benchmarks or not results.complete(machine, c, benchmarks)]
    after = PUBLISH + (8 * PER_PAIRED_POINT if todo else 0)  # pairs: a few points asv flags, as a rule
    estimate = SECONDS_PER_COMMIT * len(todo) + after + (0 if (common.ROOT / ".asv" / "env").is_dir() else FIRST_ENV)
    print(f"{len(commits)} commit(s) of {common.BRANCH} selected; {len(commits) - len(todo)} already have results on "
          f"{machine!r}, benchmarking {len(todo)}: about {minutes(estimate)} with publish and pairs", flush=True)
    started = time.monotonic()
    if todo:
        common.asv_run(todo, machine, lines=Progress(todo, after))
    publish.publish()
    tip = common.git("rev-parse", common.BRANCH)
    failed = summary(machine, commits, tip, todo)
    print(f"\n{publish.VIEW}\n[bench] done in {minutes(time.monotonic() - started)}")
    return verdict(tip, failed)
