"""``bisect GOOD BAD --bench 'NAME(PARAMS)'``: the first commit where one benchmark point got worse, by the gate's rule.

``asv find`` bisects on single medians over every parameter combination, so on a timing it names noise as readily
as a regression. This judges one point as the gate does (a timing in pairs beside GOOD, a count by its factor):
exit 1 when BAD is not worse than GOOD; else it bisects main's first-parent history between them, stepping over a
commit it cannot judge (as ``git bisect skip``). Exit 0 naming the first bad commit, 2 naming the range when some
commits could not be judged, or on an error.
"""

import difflib
import itertools
import re

from .. import common, results
from .bench import describe
from .gate import COUNT_FACTOR, DEFAULT_FACTOR, FACTOR, REGEX, exact_factor, method_of, partial

LOCKS_WORKSPACE = True
ERROR_EXIT = 2  # 1 means no change to find


def setup_arguments(subparsers):
    parser = subparsers.add_parser("bisect", allow_abbrev=False,
                                   help="find the first commit where one benchmark point got worse (the gate's rule)")
    parser.add_argument("good", metavar="GOOD", help="a commit where the point was fine")
    parser.add_argument("bad", metavar="BAD", help="a later commit of main's first-parent history where it is worse")
    parser.add_argument("--bench", type=REGEX, required=True, metavar="REGEX",
                        help="selects exactly one point, e.g. 'CacheStrategy.time_decode\\(256, .concat.\\)'")
    parser.add_argument("--factor", type=FACTOR, default=DEFAULT_FACTOR,
                        help=f"a timing is worse beyond this paired ratio (default {DEFAULT_FACTOR})")
    return parser


def labels():
    """Every point of the suite asv discovered last (``benchmarks.json``), labelled as asv's ``--bench`` matches it."""
    return [f"{name}({', '.join(combo)})" if combo else name
            for name, info in results.suite().items() for combo in itertools.product(*info.get("params") or [])]


def check_selects(pattern):
    """UserError naming ``pattern`` and the nearest points' labels (difflib) when it selects none of the suite's points
    (nothing to check before asv has discovered the suite)."""
    known = labels()
    if not known or any(re.search(pattern, label) for label in known):
        return
    typed = re.sub(r"\\(.)", r"\1", pattern)  # the text the pattern matches: escapes undone
    near = difflib.get_close_matches(typed, known, n=3, cutoff=0.5)
    raise common.UserError(f"--bench {pattern!r} selects no benchmark point of the suite"
                           + (f"; the nearest: {', '.join(near)}" if near else ""))


class Point:
    """The one point ``pattern`` selects, measured and judged commit by commit."""

    def __init__(self, pattern, factor, machine):
        self.pattern, self.factor, self.machine, self.label, self.measured = pattern, factor, machine, None, set()

    def stored(self, commit):
        if commit not in self.measured:
            common.asv_run([commit], self.machine, "--bench", self.pattern)
            self.measured.add(commit)
        points = {k: p for k, p in results.stored(self.machine, commit).items() if re.search(self.pattern, k)}
        if len(points) > 1:
            raise common.UserError(f"--bench {self.pattern!r} selects {len(points)} points "
                                   f"({', '.join(sorted(points)[:4])}, ...): give a pattern that selects one")
        if not points:
            check_selects(self.pattern)  # asv has discovered the suite now
        self.label = next(iter(points), self.label)
        return next(iter(points.values()), None)

    def worse(self, good, commit):
        """``(worse or None if it cannot be judged, ratio commit / GOOD)``: a timing's ratio in pairs beside GOOD."""
        a, b = self.stored(good), self.stored(commit)
        if a is None or b is None or not (results.is_measured(a.value) and results.is_measured(b.value)):
            return None, None
        if method_of(self.label).startswith("time_") and good != commit:
            from .. import pairs

            outcome = pairs.measure(pairs.environments()[0], good, commit, [(b.benchmark, b.index, self.label)],
                                    lambda line: None, self.factor)[self.label]
            return (outcome.worse(self.factor), outcome.ratio) if isinstance(outcome, pairs.Paired) else (None, None)
        limit = self.factor if method_of(self.label).startswith("time_") else exact_factor(self.label, COUNT_FACTOR)
        return (None if limit is None else b.value / a.value > limit), b.value / a.value


def run(args):
    good, bad = common.resolve(args.good), common.resolve(args.bad)
    chain = [good, *common.git("rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()]
    if len(chain) < 2 or common.git("rev-parse", f"{chain[1]}^") != good:
        raise common.UserError(f"GOOD {good[:8]} is not an earlier commit of BAD {bad[:8]}'s first-parent history")
    check_selects(args.bench)
    point = Point(args.bench, args.factor, common.record_machine())
    try:
        verdict, ratio = point.worse(good, bad)
        if verdict is None:
            raise common.UserError(f"{point.label or args.bench} cannot be judged at GOOD or BAD (failed, skipped "
                                   "or not measured there): choose other commits")
        print(f"\n{point.label}: BAD {bad[:8]} is {ratio:.4f}x GOOD {good[:8]} ({len(chain) - 2} commits between)")
        if not verdict:
            print("bisect: exit 1 (no change to find: BAD is not worse than GOOD beyond its factor)")
            return 1
        lo, hi, skipped = 0, len(chain) - 1, set()
        while hi - lo > 1 and (candidates := [i for i in range(lo + 1, hi) if i not in skipped]):
            i = min(candidates, key=lambda i: (abs(i - (lo + hi) // 2), i))
            verdict, ratio = point.worse(good, chain[i])
            print(f"  {describe(chain[i])}: {'n/a' if ratio is None else f'{ratio:.4f}x'} of GOOD -> "
                  f"{ {True: 'bad', False: 'good', None: 'cannot be judged, skipped'}[verdict] }", flush=True)
            if verdict is None:
                skipped.add(i)
            elif verdict:
                hi = i
            else:
                lo = i
    finally:  # the other parameter combinations asv stored as NaN: the main job measures the benchmark whole
        results.forget(point.machine, point.measured, lambda points: not partial(points, args.bench))
    if hi - lo == 1:
        print(f"\nfirst bad commit: {describe(chain[hi])}")
        return 0
    print("\nthe change is in one of these commits (some could not be judged):")
    for commit in chain[lo + 1:hi + 1]:
        print(f"  {describe(commit)}")
    return 2
