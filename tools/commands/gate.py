"""``gate BASE HEAD``: benchmark two commits where needed, print asv's comparison, exit 0, 1 or 2.

Two channels, each point judged by asv's own rule (:func:`tools.results.head_is_worse`):

- work: the instruction counts and estimated cycles (:data:`COUNT_BENCHMARKS`,
  ``benchmarks/counts.py``), worse by more than ``--count-factor``
  (:data:`COUNT_FACTOR`; estimated cycles at least :data:`CYCLES_FACTOR`); they have
  no samples, so the factor alone decides;
- time: every other point, worse by more than ``--factor`` and significant. A ``time_`` point is
  judged in pairs (:mod:`tools.pairs`): BASE and HEAD measured again in two worker processes, one in
  each commit's asv environment, taking turns on one core; worse when the median of the per-pair
  ratios HEAD / BASE is beyond the factor (:data:`DEFAULT_FACTOR`) and its 95 % interval lies above
  1. ``--unpaired`` judges by asv's unpaired samples instead (Mann-Whitney U, :data:`UNPAIRED_FACTOR`);
  ``track_`` and ``peakmem_`` values are single values and never paired.

Each flagged point says which channel moved (:func:`channel`): "work changed"
when the counts of its work moved (a count point itself, or a timing whose
strategy's count points moved beyond the count factor), "exact value changed"
for any other ``track_`` value (bytes, steps: exact, but not the work channel),
"time changed, work did not" when the counts did not (likely the machine), "time
changed, work not counted" where no count point covers it. Exit codes: 0 nothing got
worse; 1 something did, each point named with its ratio and channel; 2 a point
failed or a commit has no results (also when something got worse too), or the
command line or a commit name was wrong.
"""

import argparse
import itertools
import math
import re
import time

from .. import common, results

# Paired timings (tools/pairs.py): the factor the paired A/A supports on a 2-core VM with a neighbour busy and idle
# in turns (docs/benchmarking.md, "Measured noise"). Unpaired, asv's medians of two separate runs: the worst A/A
# ratio was 1.08 on a quiet machine, so 1.10.
DEFAULT_FACTOR = 1.03
UNPAIRED_FACTOR = 1.10
# peakmem_ benchmarks (a process's peak RSS, one value, no samples) drifted by 11-13 % between
# separate asv runs of identical code, so they count as a regression only beyond this factor.
PEAKMEM_FACTOR = 1.25
ERROR_EXIT = 2  # a usage or user error; 1 means a regression
# Instruction counts and estimated cycles (callgrind, benchmarks/counts.py): their own channel and factor. The largest
# A/A deviation was 0.031 % for an instruction count and 0.071 % for an estimated cycle count (docs/benchmarking.md,
# "Measured noise"): 1.005 leaves seven times that, and flags 1 % more work with room to spare.
COUNT_BENCHMARKS = ("track_instructions", "track_estimated_cycles")
COUNT_FACTOR = 1.005
# Estimated cycles weigh callgrind's simulated cache misses, which move with where the arrays land: a change to
# decode.py that ragged decode never calls moved padded's estimated cycles by 0.61 % (and another, by 0.52 %),
# its instructions by under 0.05 %. So cycles have a factor of their own, over twice that.
CYCLES_FACTOR = 1.015
# The lab's ratios in pairs (benchmarks/ratios.py): answers to the lab's questions, never a regression in
# themselves (a faster denominator raises a ratio); the timings they are made of are judged in pairs.
# The roofline's rates (bench_roofline) are the machine's, higher is better: its paired fraction (a track_ratio)
# is the comparison, and asv's rule would call a faster step worse.
RATIO_BENCHMARKS = ("track_ratio", "track_ratio_low", "track_ratio_high", "track_step_gbps", "track_read_gbps")
LENGTH_PARAMS = ("T",)  # a count point stands for its strategy's work at every length
WORK_CHANGED = "work changed"
VALUE_CHANGED = "exact value changed"  # a track_ value that is not a count point: exact, not the work channel
TIME_ONLY = "time changed, work did not"
NOT_COUNTED = "time changed, work not counted"
VANISHED = "(vanished: a value at BASE, n/a at HEAD)"
LOCKS_WORKSPACE = True  # one job at a time in .asv/ (tools/lock.py)


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


def setup_arguments(subparsers):
    parser = subparsers.add_parser("gate", allow_abbrev=False,
                                   help="compare two commits; exit 0 (no regression), 1 (regression), 2 (failure)")
    parser.add_argument("base", metavar="BASE", help="the reference commit (e.g. HEAD~1 or main)")
    parser.add_argument("head", metavar="HEAD", help="the commit under test (e.g. HEAD)")
    parser.add_argument("--factor", type=factor,
                        help=f"flag a timing when HEAD is slower than BASE by more than this ratio and significantly "
                             f"so (default {DEFAULT_FACTOR} paired, {UNPAIRED_FACTOR} with --unpaired; track_ values "
                             f"{UNPAIRED_FACTOR})")
    parser.add_argument("--unpaired", action="store_true",
                        help="judge timings by asv's stored samples of the two separate runs (Mann-Whitney U), "
                             "without measuring them again in pairs")
    parser.add_argument("--count-factor", type=factor, default=COUNT_FACTOR,
                        help=f"flag an instruction count or estimated cycles when HEAD's is larger than BASE's by "
                             f"more than this ratio (default {COUNT_FACTOR})")
    parser.add_argument("--bench", type=bench_regex, metavar="REGEX",
                        help="only benchmarks whose name matches REGEX (asv run --bench)")
    return parser


def method_of(label):
    """``track_instructions`` of ``bench_cache.CacheCounts.track_instructions(64, 'concat')``."""
    return label.split("(")[0].rsplit(".", 1)[-1]


def factor_for(label, factor, count_factor):
    """The factor a point is judged with: counts, peak RSS and the rest (timings) each their own."""
    method = method_of(label)
    if method == "track_estimated_cycles":
        return max(count_factor, CYCLES_FACTOR)
    if method in COUNT_BENCHMARKS:
        return count_factor
    if method.startswith("peakmem_"):
        return max(factor, PEAKMEM_FACTOR)
    if method.startswith("track_"):  # single values, measured once: never the paired timings' factor
        return max(factor, UNPAIRED_FACTOR)
    return factor


def point_params(rows, param_names):
    """``{(label, env): {param name: value repr}}`` of every parameter combination, labelled as asv compare does."""
    points = {}
    for key, params, *_, env_name in rows:
        names = param_names.get(key) or [f"param{i + 1}" for i in range(len(params))]
        for combo in itertools.product(*params):
            label = f"{key}({', '.join(combo)})" if combo else key
            points[(label, env_name)] = dict(zip(names, combo))
    return points


def covers(count_label, count_params, label, params):
    """True when a count point measures the work of point ``label``: same bench module, and the same value of
    every parameter the count point has except its length (LENGTH_PARAMS)."""
    if count_label.split(".")[0] != label.split(".")[0]:
        return False
    return all(params.get(name) == value for name, value in count_params.items() if name not in LENGTH_PARAMS)


def channel(label, params, counts):
    """Which channel moved for a flagged point; ``counts``: ``[(label, params, moved)]`` of the compared counts."""
    if method_of(label) in COUNT_BENCHMARKS:
        return WORK_CHANGED
    if method_of(label).startswith("track_"):
        return VALUE_CHANGED
    covering = [moved for count_label, count_params, moved in counts
                if covers(count_label, count_params, label, params)]
    if any(covering):
        return WORK_CHANGED
    return TIME_ONLY if covering else NOT_COUNTED


def judge(base_rows, head_rows, factor, count_factor=COUNT_FACTOR, param_names=None, paired=None):
    """asv compare's verdict per benchmark point: ``(regressions, failures)``.

    regressions: ``[(name, ratio head/base, channel)]`` where :func:`results.head_is_worse`
    with :func:`factor_for`'s factor; ``channel`` as :func:`channel`, a count point having
    moved when its ratio is beyond ``count_factor`` either way. failures:
    ``[(name, commit role)]`` where a stored value is None (a failed benchmark or
    correctness check), and where a point with a value at BASE is n/a at HEAD
    (:func:`results.vanished`, unless retired in benchmarks/common.py). Points whose
    benchmark code changed between the two (asv marks them x), and the paired ratios
    (:data:`RATIO_BENCHMARKS`), are not compared.
    ``param_names``: benchmark -> asv's param_names. ``paired``: ``{(label, env):
    tools.pairs.Paired}``, the paired verdicts that replace asv's for those points
    (their ratio is the median of the per-pair ratios).
    """
    base, head = results.unrolled(base_rows), results.unrolled(head_rows)
    params = {**point_params(base_rows, param_names or {}), **point_params(head_rows, param_names or {})}
    worse, counts = [], []
    failures = [(f"{label}  {VANISHED}", "head") for label in results.vanished(base, head)]
    for name in sorted(set(base) | set(head)):
        label = name[0]
        (value_1, ss_1, version_1), (value_2, ss_2, version_2) = (
            points.get(name, (math.nan, None, None)) for points in (base, head))
        failures += [(label, role) for role, value in (("base", value_1), ("head", value_2)) if value is None]
        if value_1 is None or value_2 is None or math.isnan(value_1) or math.isnan(value_2):
            continue
        if version_1 is not None and version_2 is not None and version_1 != version_2:
            continue
        if method_of(label) in RATIO_BENCHMARKS:
            continue
        ratio = value_2 / value_1 if value_1 else math.inf
        if method_of(label) in COUNT_BENCHMARKS:
            moved = max(ratio, 1 / ratio if ratio else math.inf) > factor_for(label, factor, count_factor)
            counts.append((label, params.get(name, {}), moved))
        if paired and name in paired:
            if paired[name].worse(factor):
                worse.append((name, paired[name].ratio))
        elif results.head_is_worse(value_1, value_2, ss_1, ss_2, factor_for(label, factor, count_factor)):
            worse.append((name, ratio))
    regressions = [(name[0], ratio, channel(name[0], params.get(name, {}), counts)) for name, ratio in worse]
    return regressions, failures


def channel_summary(base_rows, head_rows, benchmarks, factor=UNPAIRED_FACTOR, count_factor=COUNT_FACTOR,
                    paired=None):
    """The main job's two channels for one commit against an older one: ``(text, points)``.

    text: 'work same, time 2 worse (max 1.12x)'; points: ``[(channel, label, ratio)]``
    behind it. work: the count points (:data:`COUNT_BENCHMARKS`) worse than
    ``count_factor``; time: every other point the gate would flag, judged on
    asv's unpaired samples at ``factor`` unless ``paired`` gives the paired verdicts.
    """
    regressions, _ = judge(base_rows, head_rows, factor, count_factor, param_names_of(benchmarks), paired)
    phrases, points = [], []
    for name, is_count in (("work", True), ("time", False)):
        worse = [(label, ratio) for label, ratio, _ in regressions if (method_of(label) in COUNT_BENCHMARKS) == is_count]
        points += [(name, label, ratio) for label, ratio in worse]
        phrases.append(f"{name} {len(worse)} worse (max {ratio_text(max(r for _, r in worse))})" if worse
                       else f"{name} same")
    return ", ".join(phrases), points


def param_names_of(benchmarks):
    """benchmark -> asv's ``param_names`` from asv's Benchmarks (``{}`` when there are none)."""
    return {name: info.get("param_names", []) for name, info in (benchmarks or {}).items()}


def run(args):
    commits = {role: common.resolve(name) for role, name in (("base", args.base), ("head", args.head))}
    if commits["base"] == commits["head"]:
        print(f"note: BASE and HEAD are the same commit {commits['head'][:8]}: the comparison is of its "
              "results with themselves")
    common.record_machine()
    results.quarantine_unreadable()
    try:
        return compare(args, commits)
    finally:  # also when stopped: what --bench measured of only part of a benchmark is not kept
        conf, _, machine, env_names = results.asv_setup()
        if args.bench and results.drop_partial(conf, machine, env_names, set(commits.values()), args.bench):
            print("note: results of benchmarks measured here for only some parameter combinations were not kept, "
                  "so that the main job measures them whole")


def compare(args, commits):
    """The gate after its commits are resolved: asv run, asv's table, the pairs, the verdict; the exit code."""
    from asv.commands.compare import Compare

    common.asv_run(list(dict.fromkeys(commits.values())), *(["--bench", args.bench] if args.bench else []))
    conf, benchmarks, machine, env_names = results.asv_setup()
    rows = {role: results.compare_rows(conf, results.iter_results(conf, machine, commit, env_names), args.bench)
            for role, commit in commits.items()}
    missing = [role for role in commits if not rows[role]]
    for role in missing:
        print(f"\n{role} {commits[role][:8]} has no results on {machine!r}: it did not build or install "
              "(see asv's output above), or --bench matched nothing")
    if not missing:
        table_factor = args.factor or UNPAIRED_FACTOR  # asv's table judges asv's unpaired medians
        verdict = ("for reference: the timings' verdict is asv's medians here"
                   if args.unpaired else "for reference only, not the verdict: its timing rows compare medians "
                   "taken minutes apart, and the host's drift moves them; the timings are judged below, in pairs")
        print(f"\nasv compare of the two runs' medians, factor {table_factor} ({verdict}; the counts at "
              f"{args.count_factor}):")
        Compare.print_table(conf, commits["base"], commits["head"], factor=table_factor, split=True,
                            resultset_1=iter(rows["base"]), resultset_2=iter(rows["head"]), machine=machine,
                            commit_names={c: name for c, name in zip(commits.values(), (args.base, args.head))})
    args.factor = args.factor or (UNPAIRED_FACTOR if args.unpaired else DEFAULT_FACTOR)
    paired, pair_failures = {}, []
    if not missing and not args.unpaired:
        paired, pair_failures = pair_timings(conf, benchmarks, commits, rows, args.factor)
    regressions, failures = judge(rows["base"], rows["head"], args.factor, args.count_factor,
                                  param_names_of(benchmarks), paired)
    failures += pair_failures
    for label, ratio, moved in regressions:
        print(f"REGRESSION {ratio_text(ratio)}  {label}  ({moved})")
    for label, role in failures:
        print(f"FAILED at {role} {commits[role][:8]}  {label}")
    if any(label.endswith(VANISHED) for label, _ in failures):
        print(results.RETIRE_HINT)
    if missing or failures:
        print(f"gate: exit 2 ({len(failures)} failed benchmark point(s), {len(missing)} commit(s) without results, "
              f"{len(regressions)} regression(s): {channel_counts(regressions)})")
        return 2
    if regressions:
        print(f"gate: exit 1 ({len(regressions)} point(s) worse: {channel_counts(regressions)}; counts beyond "
              f"{args.count_factor}x, timings beyond {args.factor}x{' paired' if paired else ''} and significant)")
        if any(moved not in (WORK_CHANGED, VALUE_CHANGED) for _, _, moved in regressions):
            print("a timing flagged in pairs was measured beside its base, on the same machine at the same time: "
                  "re-running this gate measures the pairs again" if paired else
                  f"to check a timing is not noise, measure HEAD again: delete "
                  f"{results.result_files(conf, machine, commits['head'])} and re-run this gate, or drop --unpaired")
        return 1
    print(f"gate: exit 0 (no count worse than {args.count_factor}x, no timing worse than {args.factor}x"
          f"{' paired' if paired else ''})")
    return 0


def pair_timings(conf, benchmarks, commits, rows, factor=DEFAULT_FACTOR):
    """The paired verdicts of every ``time_`` point both commits measured: ``({(label, env): Paired}, failures)``.

    A point worse than ``factor`` is measured in pairs again, by two new worker
    processes, and stays worse only if that confirms it.

    Failures: ``[(label, role)]`` of the points whose paired run failed (a worker's
    check or benchmark raised where asv's run had passed), named with the reason.
    """
    from .. import pairs

    base, head = results.unrolled(rows["base"]), results.unrolled(rows["head"])
    comparable = [name for name in sorted(base) if name in head and method_of(name[0]).startswith("time_")
                  and all(isinstance(p[name][0], float) and math.isfinite(p[name][0]) for p in (base, head))
                  and base[name][2] == head[name][2]]
    paired, failures = {}, []
    for env in pairs.environments(conf):
        labels = [label for label, env_name in comparable if env_name == env.name]
        points = pairs.timing_points(benchmarks, labels)
        if not points:
            continue
        print(f"\ntimings in pairs: {len(points)} points, HEAD / BASE (median of per-pair ratios [95 % interval]), "
              f"{env.name}:", flush=True)
        started = time.monotonic()
        measured = pairs.measure_confirmed(conf, env, commits["base"], commits["head"], points, factor)
        print(f"timings in pairs: {len(points)} points in {time.monotonic() - started:.0f} s", flush=True)
        for label, outcome in measured.items():
            if isinstance(outcome, pairs.Paired):
                paired[(label, env.name)] = outcome
            else:
                print(f"not paired: {label}: {outcome}")
                if "failed" in outcome:
                    failures.append((f"{label}  (paired run: {outcome['failed']})", outcome["role"]))
    return paired, failures


def ratio_text(ratio):
    """1.32x, or 1.0123x for a ratio the two-decimal form would show as 1.01x or 1.00x."""
    return f"{ratio:.2f}x" if abs(ratio - 1) >= 0.05 else f"{ratio:.4f}x"


def channel_counts(regressions):
    """'2 work changed, 1 time changed, work did not' of ``judge``'s regressions ('none' without any)."""
    tally = {}
    for _, _, moved in regressions:
        tally[moved] = tally.get(moved, 0) + 1
    return ", ".join(f"{n} {moved}" for moved, n in tally.items()) or "none"
