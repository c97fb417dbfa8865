"""``bisect GOOD BAD --bench 'NAME(PARAMS)'``: the first commit where one benchmark point got worse, by the gate's rule.

``asv find`` bisects on single medians, and over a parameterized benchmark it
follows the largest change of any of its points, so on a timing it names noise
as readily as a regression, and it always names some commit. This command
judges one point, as the gate does (:func:`tools.commands.gate.judge`: worse
than GOOD by more than the factor and significant), and says when there is
nothing to find:

1. it measures GOOD and BAD at the point (``asv run --bench``, reusing stored
   results) and stops, exit 1, unless BAD is worse than GOOD;
2. it bisects main's first-parent history between them: a commit worse than
   GOOD is bad, any other good. A commit that cannot be judged (its build or
   the point failed, or it skips the point) is stepped over, as ``git bisect
   skip`` does.

It names the first bad commit (exit 0), or the commits the change lies among
when some could not be judged (exit 2). Errors exit 2. For a ``track_`` count,
whose values repeat exactly, ``asv find`` gives the same commit.
"""

import itertools
import math

from .. import common, pairs, results
from .gate import (DEFAULT_FACTOR, ERROR_EXIT, UNPAIRED_FACTOR, bench_regex, factor, judge,  # noqa: F401
                   method_of)  # (ERROR_EXIT: dev.py's)

LOCKS_WORKSPACE = True  # it runs asv in .asv/: one job at a time (tools/lock.py)


def setup_arguments(subparsers):
    parser = subparsers.add_parser("bisect", allow_abbrev=False,
                                   help="find the first commit where one benchmark point got worse (the gate's rule)")
    parser.add_argument("good", metavar="GOOD", help="a commit where the point was fine (e.g. the gate's BASE)")
    parser.add_argument("bad", metavar="BAD", help="a later commit of main's first-parent history where it is worse")
    parser.add_argument("--bench", type=bench_regex, required=True, metavar="REGEX",
                        help="selects exactly one benchmark point, as asv run --bench does, e.g. "
                             "'CacheStrategy.time_decode\\(256, .concat.\\)'")
    parser.add_argument("--factor", type=factor,
                        help=f"worse means slower by more than this ratio, and significant (default {DEFAULT_FACTOR} "
                             f"for a timing in pairs, {UNPAIRED_FACTOR} with --unpaired or for a track_ value; "
                             "peakmem_ at least the gate's peakmem factor)")
    parser.add_argument("--unpaired", action="store_true",
                        help="judge a timing by asv's stored samples, as the gate's --unpaired does")
    return parser


def history(good, bad):
    """``[GOOD, ..., BAD]``: GOOD and the commits of BAD's first-parent history after it, oldest first."""
    after = common.git("rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()
    if not after:
        raise common.UserError(f"BAD {bad[:8]} is not a later commit than GOOD {good[:8]}")
    if common.git("rev-parse", f"{after[0]}^") != good:
        raise common.UserError(f"GOOD {good[:8]} is not on BAD {bad[:8]}'s first-parent history (main's, "
                               "as the dashboard graphs it): give a GOOD commit of it")
    return [good, *after]


class Point:
    """The one benchmark point ``pattern`` selects, measured and judged commit by commit."""

    def __init__(self, pattern, factor, unpaired=False):
        self.pattern, self.factor, self.unpaired = pattern, factor, unpaired
        self.rows = {}  # commit -> rows in asv compare's form
        self.measured = set()
        self.pairs = {}  # (good, commit) -> tools.pairs.Paired, or the outcome of a point that did not load
        self.label = None  # the one point the pattern selects (check_one), once asv knows the suite

    def measure(self, commits):
        commits = [c for c in commits if c not in self.rows]
        if commits:
            common.asv_run(commits, "--bench", self.pattern)
            self.measured.update(commits)
        conf, _, machine, env_names = results.asv_setup()
        for commit in commits:
            self.rows[commit] = results.compare_rows(
                conf, results.iter_results(conf, machine, commit, env_names), self.pattern)

    def check_one(self):
        """The point's label (None before asv discovered the suite); UserError unless the pattern selects one point."""
        from asv.benchmarks import Benchmarks

        conf, benchmarks, _, _ = results.asv_setup()
        if benchmarks is None:
            return None
        chosen = Benchmarks(conf, list(benchmarks.values()), regex=self.pattern)
        labels = []
        for name in chosen:
            selection = chosen.benchmark_selection[name]
            params = benchmarks[name]["params"]
            for i, combo in enumerate(itertools.product(*params)):
                if selection is None or i in selection:
                    labels.append(f"{name}({', '.join(combo)})" if combo else name)
        if len(labels) != 1:
            listed = ", ".join(labels[:5]) + (", ..." if len(labels) > 5 else "")
            raise common.UserError(f"--bench {self.pattern!r} selects {len(labels)} benchmark points "
                                   f"({listed or 'none'}); give a pattern that selects one")
        return labels[0]

    def value(self, commit):
        """The stored value at ``commit``: a number, None (failed) or NaN (skipped, or not measured)."""
        values = [value for value, _, _ in results.unrolled(self.rows[commit]).values()
                  if value is None or not math.isnan(value)]  # the pattern's other combinations are NaN
        return values[0] if len(values) == 1 else math.nan

    def worse(self, good, commit):
        """True / False: ``commit`` is worse than ``good`` by the gate's rule; None if it cannot be judged."""
        value = self.value(commit)
        if value is None or math.isnan(value):
            return None
        paired = self.paired(good, commit)
        if paired is not None and not isinstance(paired, pairs.Paired):
            return None  # its paired run skipped or failed
        env_name = next(iter(results.unrolled(self.rows[commit])))[1]
        regressions, _ = judge(self.rows[good], self.rows[commit], self.factor,
                               paired=paired and {(self.label, env_name): paired})
        return bool(regressions)

    def paired(self, good, commit):
        """For a ``time_`` point: GOOD and ``commit`` timed in pairs (:mod:`tools.pairs`, once); else None."""
        if self.unpaired or good == commit or not method_of(self.label).startswith("time_"):
            return None
        if (good, commit) not in self.pairs:
            conf, benchmarks, _, env_names = results.asv_setup()
            env = next(e for e in pairs.environments(conf) if e.name in env_names)
            measured = pairs.measure(conf, env, good, commit, pairs.timing_points(benchmarks, [self.label]),
                                     progress=lambda line: None, factor=self.factor)
            self.pairs[(good, commit)] = measured.get(self.label, {"failed": "not measured in pairs"})
        return self.pairs[(good, commit)]

    def ratio(self, base, head):
        """HEAD / BASE as text: the paired median and interval for a timing measured in pairs, else asv's values."""
        paired = self.pairs.get((base, head))
        if isinstance(paired, pairs.Paired):
            return paired.text()
        a, b = self.value(base), self.value(head)
        return f"{b / a:.3f}x" if a and b is not None and not (math.isnan(a) or math.isnan(b)) else "n/a"


def describe(commit):
    return f"{commit[:8]} {common.git('log', '-1', '--format=%s', commit)[:70]}"


def search(chain, point):
    """Bisect ``chain`` (its first commit good, its last bad): ``(last good index, first bad index, skipped)``."""
    lo, hi, skipped = 0, len(chain) - 1, set()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidates = sorted((i for i in range(lo + 1, hi) if i not in skipped), key=lambda i: (abs(i - mid), i))
        verdict = None
        for i in candidates:
            point.measure([chain[i]])
            verdict = point.worse(chain[0], chain[i])
            print(f"  {describe(chain[i])}: {point.ratio(chain[0], chain[i])} of GOOD -> "
                  f"{ {True: 'bad', False: 'good', None: 'cannot be judged, skipped'}[verdict] }", flush=True)
            if verdict is not None:
                mid = i
                break
            skipped.add(i)
        if verdict is None:
            break
        lo, hi = (lo, mid) if verdict else (mid, hi)
    return lo, hi, skipped


def run(args):
    good, bad = common.resolve(args.good), common.resolve(args.bad)
    chain = history(good, bad)
    common.record_machine()
    args.factor = args.factor or (UNPAIRED_FACTOR if args.unpaired else DEFAULT_FACTOR)
    point = Point(args.bench, args.factor, args.unpaired)
    point.check_one()  # before measuring anything, once asv knows the suite
    try:
        point.measure([good, bad])
        label = point.label = point.check_one()
        if args.unpaired and method_of(label).startswith("time_"):
            print("note: --unpaired compares medians asv stored at different times (GOOD's perhaps from another "
                  "run): a timing's verdict may be the machine's drift, not a commit's; without --unpaired each "
                  "commit is timed beside GOOD, in pairs")
        for role, commit in (("GOOD", good), ("BAD", bad)):
            if point.worse(good, commit) is None:
                raise common.UserError(f"{label} has no measured value at {role} {commit[:8]} (its build or "
                                       "the point failed, or the commit skips it): choose another commit")
        print(f"\n{label}: BAD {bad[:8]} is {point.ratio(good, bad)} of GOOD {good[:8]} "
              f"({len(chain) - 2} commits between)")
        if not point.worse(good, bad):
            why = ("no change to find: the value is the same at GOOD and BAD" if point.value(good) == point.value(bad)
                   else f"BAD is not worse than GOOD by more than {args.factor}x and significantly: nothing to bisect")
            print(f"bisect: exit 1 ({why})")
            return 1
        lo, hi, skipped = search(chain, point)
    finally:
        conf, _, machine, env_names = results.asv_setup()
        results.drop_partial(conf, machine, env_names, point.measured, args.bench)
    if hi - lo == 1:
        print(f"\nfirst bad commit: {describe(chain[hi])}\n  {label}: {point.ratio(chain[lo], chain[hi])} of "
              f"its parent, {point.ratio(good, chain[hi])} of GOOD")
        return 0
    print("\nthe change is in one of these commits (some could not be judged):")
    for commit in chain[lo + 1:hi + 1]:
        print(f"  {describe(commit)}")
    return 2
