"""``gate BASE HEAD``: benchmark two commits where needed, print asv compare's table, judge: counts by
COUNT_FACTOR, ``time_`` points in pairs (:mod:`tools.pairs`) by ``--factor``, other values by their factor
below. Exit 0: nothing worse; 1: a point worse; 2: a failure, no results, a usage error.
"""

import math

from .. import common, results

DEFAULT_FACTOR = 1.03  # paired: the A/A beside a busy neighbour stays within it (docs/benchmarking.md)
UNPAIRED_FACTOR = 1.10  # asv's medians of two separate runs: the worst A/A was 1.08 on a quiet machine
PEAKMEM_FACTOR = 1.25  # a process's peak RSS drifted 11-13 % between runs of identical code
COUNT_BENCHMARKS = ("track_instructions", "track_estimated_cycles")
COUNT_FACTOR = 1.005  # the largest A/A deviation of a count was 0.07 %
CYCLES_FACTOR = 1.015  # estimated cycles move with where arrays land (cache misses): 0.6 % for unrelated code
VANISHED = "(vanished: a value at BASE, n/a at HEAD)"
ERROR_EXIT = 2  # a usage or user error; 1 means a regression
LOCKS_WORKSPACE = True
FACTOR = common.checked(float, lambda v: 1 < v < math.inf, "a finite number greater than 1")


def setup_arguments(subparsers):
    parser = subparsers.add_parser("gate", allow_abbrev=False,
                                   help="compare two commits; exit 0 (no regression), 1 (regression), 2 (failure)")
    parser.add_argument("base", metavar="BASE", help="the reference commit (e.g. HEAD~1 or main)")
    parser.add_argument("head", metavar="HEAD", help="the commit under test (e.g. HEAD)")
    parser.add_argument("--factor", type=FACTOR, default=DEFAULT_FACTOR,
                        help=f"a timing is worse beyond this paired ratio (default {DEFAULT_FACTOR})")
    return parser


def method_of(label):
    """``track_instructions`` of ``bench_cache.CacheCounts.track_instructions(64, 'concat')``."""
    return label.split("(")[0].rsplit(".", 1)[-1]


def failures(base, head):
    """``[(label, role)]``: points whose stored value is None (failed), and those that vanished at HEAD."""
    failed = [(label, role) for role, points in (("base", base), ("head", head))
              for label, point in sorted(points.items()) if point.value is None]
    return failed + [(f"{label}  {VANISHED}", "head") for label in results.vanished(base, head)]


def print_failures(failed, where):
    """``FAILED at <where(role)>  <label>`` for each, and how to retire a benchmark if one vanished."""
    for label, role in failed:
        print(f"FAILED at {where(role)}  {label}")
    if any(label.endswith(VANISHED) for label, _ in failed):
        print("note: a vanished benchmark removed on purpose passes once it is declared, with the reason, in RETIRED "
              "in benchmarks/common.py")


def comparable(base, head, label):
    """Both commits measured ``label``, with the same benchmark version (asv compare's x otherwise)."""
    a, b = base.get(label), head.get(label)
    return (a is not None and b is not None and results.is_measured(a.value) and results.is_measured(b.value)
            and (a.version is None or b.version is None or a.version == b.version))


def exact_regressions(base, head):
    """``[(label, ratio, channel)]`` of the stored values (counts, bytes, peak RSS) worse than their factor."""
    worse = []
    for label in sorted(head):
        method = method_of(label)
        if method.startswith("time_") or not comparable(base, head, label):
            continue
        limit = {"track_instructions": COUNT_FACTOR, "track_estimated_cycles": CYCLES_FACTOR}.get(
            method, PEAKMEM_FACTOR if method.startswith("peakmem_") else UNPAIRED_FACTOR)
        a, b = base[label].value, head[label].value
        ratio = b / a if a else (1.0 if not b else math.inf)
        if ratio > limit:
            worse.append((label, ratio, "work" if method in COUNT_BENCHMARKS else "value"))
    return worse


def asv_compare(base, head, machine, factor=UNPAIRED_FACTOR):
    """``asv compare --only-changed --factor F BASE HEAD`` as asv prints it; ``[(mark, label)]`` of the rows it marks:
    + worse, - better, ! failed at HEAD."""
    done = common.run(*common.ASV, "compare", "--only-changed", "--factor", str(factor), "--machine", machine,
                      base, head, check=False, capture=True)
    print(done.stdout + done.stderr)
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in done.stdout.splitlines()]
    return [(row[0], row[-1]) for row in cells if len(row) >= 5 and row[0] in ("+", "-", "!")]


def pair(commits, labels, base, head, factor):
    """The paired verdicts of ``labels``' timings: ``({label: Paired}, [(label, role)] of failed pairs)``."""
    from .. import pairs

    points = [(head[label].benchmark, head[label].index, label) for label in labels
              if method_of(label).startswith("time_") and comparable(base, head, label)]
    if not points:
        return {}, []
    print(f"\ntimings in pairs: {len(points)} points, HEAD / BASE (median of per-pair ratios [95 % interval]):",
          flush=True)
    outcomes = pairs.measure_confirmed(pairs.environments()[0], commits["base"], commits["head"], points, factor)
    paired = {label: p for label, p in outcomes.items() if isinstance(p, pairs.Paired)}
    failed = [(f"{label}  (paired run: {p['failed']})", p["role"]) for label, p in outcomes.items()
              if label not in paired and "failed" in p]
    return paired, failed


def ratio_text(ratio):
    """1.32x, or 1.0123x for a ratio the two-decimal form would show as 1.01x or 1.00x."""
    return f"{ratio:.2f}x" if abs(ratio - 1) >= 0.05 else f"{ratio:.4f}x"


def run(args):
    commits = {role: common.resolve(name) for role, name in (("base", args.base), ("head", args.head))}
    machine = common.record_machine()
    common.asv_run(list(dict.fromkeys(commits.values())), machine)
    base, head = (results.stored(machine, commits[role]) for role in ("base", "head"))
    missing = [role for role, points in (("base", base), ("head", head)) if not points]
    for role in missing:
        print(f"{role} {commits[role][:8]} has no results on {machine!r}: it did not build or install "
              "(see asv's output above)")
    if missing:
        print(f"gate: exit 2 ({len(missing)} commit(s) without results)")
        return 2
    print(f"\nasv compare of {args.base} ({commits['base'][:8]}) and {args.head} ({commits['head'][:8]}), "
          f"machine {machine}:")
    asv_compare(commits["base"], commits["head"], machine)
    worse, failed = exact_regressions(base, head), failures(base, head)
    paired, pair_failed = pair(commits, list(head), base, head, args.factor)
    failed += pair_failed
    worse += [(label, p.ratio, "time, paired") for label, p in paired.items() if p.worse(args.factor)]
    for label, ratio, channel in worse:
        print(f"REGRESSION {ratio_text(ratio)}  {label}  ({channel})")
    print_failures(failed, lambda role: f"{role} {commits[role][:8]}")
    if failed:
        print(f"gate: exit 2 ({len(failed)} failed benchmark point(s), {len(worse)} regression(s))")
        return 2
    print(f"gate: exit {int(bool(worse))} ({len(worse)} point(s) worse: counts beyond {COUNT_FACTOR}x, "
          f"timings beyond {args.factor}x in pairs)")
    return int(bool(worse))
