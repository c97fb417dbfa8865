"""``bench``: the main job. Benchmark a bounded sample of main's commits that can change a result, publish, summarise.

Benchmark files come from the working tree, so only a commit that changes what asv builds (RESULT_PATHS) can change
a result: the job takes a stable sample of those (:func:`sample_commits`), runs ``asv machine``, ``asv run
--record-samples --skip-existing``, main~1's timings again beside main's (:func:`beside_parent`), the lab's answers
at main (the answers suite), ``asv publish`` (:mod:`tools.publish`), and prints a summary. Exit 2 when a point failed
at main or vanished since main~1; 1 on an error.
"""

import math
import os
import time

from .. import common, publish, results
from .gate import (COUNT_FACTOR, DEFAULT_FACTOR, UNPAIRED_FACTOR, asv_compare, exact_regressions, failures, method_of,
                   pair, print_failures, ratio_text)

LOCKS_WORKSPACE = True
RESULT_PATHS = ["kv_attention", "setup.cfg", "pyproject.toml", "asv.conf.json"]
BUILD_FILES = ["setup.cfg", "pyproject.toml", "kv_attention/__init__.py"]  # all present => buildable
DEFAULT_COMMITS = 5  # 5 x ~80 s, the answers once, the .venv and the first asv environment: a fresh clone in 10-15 min
NEWEST = 2  # main and main~1: always in the sample
# Seconds of each phase on the 2-core VM when quiet, for the estimate (scaled by load / cores): a commit's build,
# install and regression suite; main~1's timings again; the answers suite at main; the first asv environment; asv
# publish with the offline copies; one timing point in pairs.
SECONDS_PER_COMMIT, PARENT_TIMINGS, ANSWERS, FIRST_ENV, PUBLISH, PER_PAIRED_POINT = 80, 35, 90, 60, 20, 8
NAMED = 5  # points named under the summary, per channel
# asv --bench patterns: what moves between runs of identical code (timings, peak RSS), measured side by side; the rest
SIDE_BY_SIDE, ALONE = r"\.(time|peakmem)_", r"^(?!.*\.(time|peakmem)_)"
COMMITS = common.checked(int, lambda n: n >= 2, "an integer of at least 2 (main and main~1)")


def setup_arguments(subparsers):
    parser = subparsers.add_parser("bench", allow_abbrev=False, help="benchmark a bounded sample of the commits of "
                                   "main that can change a result, publish, summarise")
    parser.add_argument("--commits", type=COMMITS, default=DEFAULT_COMMITS, metavar="N",
                       help=f"at most N commits: main, main~1, the newest that can change a result and older ones "
                            f"spread over the history (default {DEFAULT_COMMITS})")
    return parser


def select_commits(bound):
    """Commits of main to benchmark, newest first, each with every file of BUILD_FILES: main, main~1 and those that
    changed a path of RESULT_PATHS, at most ``bound`` of them (:func:`sample_commits`). "Of main" is its
    first-parent history, as asv's graphs: a merged branch counts as its merge commit."""
    head = common.git("rev-list", "--first-parent", "--max-count=2", common.BRANCH).split()
    changing = common.git("rev-list", "--first-parent", common.BRANCH, "--", *RESULT_PATHS).split()
    commits = [c for c in dict.fromkeys(head + changing)
               if set(common.git("ls-tree", "-r", "--name-only", c, "--", *BUILD_FILES).split()) == set(BUILD_FILES)]
    if not commits:
        raise common.UserError(f"no commit of {common.BRANCH} has a buildable package ({', '.join(BUILD_FILES)})")
    return sample_commits(commits, bound)


def sample_commits(commits, bound):
    """At most ``bound`` of ``commits`` (newest first): the NEWEST, then every ``stride``-th older one counted from
    the oldest, ``stride`` the smallest power of two that fits. Stable as history grows: a new commit changes the
    older ones only when the stride doubles, to a subset (asv's ``--steps`` re-spreads them every time)."""
    newest, older = commits[:min(NEWEST, bound)], commits[NEWEST:][::-1]  # older: oldest first
    room = bound - len(newest)
    if room <= 0 or not older:
        return newest
    stride = 1
    while math.ceil(len(older) / stride) > room:
        stride *= 2
    spread = set(older[::stride])
    return newest + [c for c in commits[NEWEST:] if c in spread]


def beside_parent(commits, todo):
    """``[main~1, main]`` when main is to be measured and main~1 is in the sample, else ``[]``. Their timings and
    peak RSS are measured in one asv run, rounds interleaved (as ``asv continuous`` does), main~1's again: ``asv
    compare HEAD~1 HEAD`` then compares values taken side by side, not a run's state against another's
    (docs/benchmarking.md)."""
    parent = common.git("rev-list", "--first-parent", "--skip=1", "--max-count=1", commits[0])
    return commits[1::-1] if commits[0] in todo and commits[1:2] == [parent] else []


def minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def describe(commit, name=""):
    return f"{name} {commit[:8]} {common.git('log', '-1', '--format=%s', commit)[:60]!r}".strip()


def summary(machine, commits, tip, measured):
    """Print main against the newest older commit with results; the failures at main."""
    stored = {c: results.stored(machine, c) for c in commits}
    if not stored[tip]:
        raise common.UserError(f"{common.BRANCH} ({tip[:8]}) has no results: its build or install failed (see above)")
    older = next((c for c in commits[1:] if stored[c]), None)
    if older:
        base, head = stored[older], stored[tip]
        print(f"\n{describe(tip, common.BRANCH)} against {describe(older, 'the older')}:")
        flagged = [label for label in asv_compare(older, tip, machine, UNPAIRED_FACTOR)
                   if method_of(label).startswith("time_")]
        work = exact_regressions(base, head, COUNT_FACTOR)
        time_worse, counts = [], [w for w in work if w[2] == "work"]
        if flagged and tip in measured:  # asv's samples flag these: the gate's pairs confirm or clear each
            paired, _ = pair({"base": older, "head": tip}, flagged, base, head, DEFAULT_FACTOR)
            time_worse = [(label, p.ratio) for label, p in paired.items() if p.worse(DEFAULT_FACTOR)]
        print(f"summary, {tip[:8]} against {older[:8]}: work {len(counts)} worse, other values "
              f"{len(work) - len(counts)} worse, time: of {len(flagged)} timing(s) asv compare flagged, "
              f"{len(time_worse)} worse in pairs" + ("" if tip in measured or not flagged else
                                                      " (measured earlier: the gate pairs)"))
        for label, ratio in [(label, ratio) for label, ratio, _ in work][:NAMED] + time_worse[:NAMED]:
            print(f"      worse {ratio_text(ratio)}  {label}")
    page = [row for row in publish.regressions(common.ROOT / ".asv" / "html") if row[2] == tip]
    print(f"the dashboard's Regressions page: {len(page)} row(s) blame {tip[:8]}" + ":" * bool(page))
    for label, first, _, before, after in page[:2 * NAMED]:
        print(f"      {ratio_text(after / before) if before else 'from 0'}  {label}"
              + (f"  (somewhere in {first[:8]}..{tip[:8]})" if first else ""))
    print(f"this summary is not a gate: the gate is `python3 tools/dev.py gate {common.BRANCH}~1 {common.BRANCH}`")
    parent = common.git("rev-list", "--first-parent", "--skip=1", "--max-count=1", tip)
    return failures(results.stored(machine, parent) if parent else {}, stored[tip])


def verdict(tip, failed):
    """Exit 2 naming each point that failed at main's tip or vanished there since main~1, else 0."""
    failed = [(label, role) for label, role in failed if role == "head"]
    print_failures(failed, lambda role: f"{common.BRANCH} {tip[:8]}")
    if failed:
        print(f"bench: exit 2 ({len(failed)} point(s) failed or vanished at {common.BRANCH})")
    return 2 if failed else 0


def run(args):
    commits = select_commits(args.commits)
    machine = common.record_machine()
    results.quarantine_unreadable(machine)
    results.forget(machine, commits, lambda points: not any(  # a timing without samples is measured again
        method_of(label).startswith("time_") and results.is_measured(p.value) and p.samples is None
        for label, p in points.items()))
    benchmarks = results.suite()
    todo = [c for c in commits if not benchmarks or not set(benchmarks) <= {  # every benchmark stored, timings sampled
        p.benchmark for p in results.stored(machine, c).values()}]
    beside, answers = beside_parent(commits, todo), not results.files(machine, commits[0], answers=True)
    after = PUBLISH + (8 * PER_PAIRED_POINT if todo else 0)  # pairs: a few points asv flags, as a rule
    estimate = (SECONDS_PER_COMMIT * len(todo) + PARENT_TIMINGS * bool(beside) + ANSWERS * answers + after
                + (0 if (common.ROOT / ".asv" / "env").is_dir() else FIRST_ENV))
    load = os.getloadavg()[0]  # the job gets about cores / load of the machine beside other jobs
    print(f"{len(commits)} commit(s) of {common.BRANCH} selected; {len(commits) - len(todo)} already have results on "
          f"{machine!r}, benchmarking {len(todo)}: about {minutes(estimate * max(1.0, load / os.cpu_count()))} with "
          f"publish and pairs at load {load:.1f}", flush=True)
    started = time.monotonic()
    common.asv_run([c for c in todo if c not in beside], machine)
    common.asv_run([c for c in beside if c in todo], machine, "--bench", ALONE)
    common.asv_run(beside, machine, "--bench", SIDE_BY_SIDE, "--interleave-rounds", skip_existing=False)
    if answers:
        common.asv_run(commits[:1], machine, config=common.answers_config())
    publish.publish()
    tip = common.git("rev-parse", common.BRANCH)
    failed = summary(machine, commits, tip, todo) + failures({}, results.stored(machine, tip, answers=True))
    print(f"\n{publish.VIEW}\n[bench] done in {minutes(time.monotonic() - started)}")
    return verdict(tip, failed)
