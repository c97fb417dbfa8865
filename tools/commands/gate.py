"""``gate BASE HEAD``: benchmark two commits where needed, print asv's comparison, exit 0, 1 or 2.

Each point is judged by asv's own rule (:func:`tools.results.head_is_worse`):
worse by more than ``--factor`` and significant. Exit codes: 0 nothing got
worse; 1 something did, each point named with its ratio; 2 a point failed or
a commit has no results (also when something got worse too), or the command
line or a commit name was wrong.
"""

import argparse
import math
import re

from .. import common, results

# The smallest factor this suite's measured A/A noise supports on a quiet 2-core machine: the worst
# ratio between two runs of identical code was 1.08 (docs/benchmarking.md, "Measured noise").
DEFAULT_FACTOR = 1.10
# peakmem_ benchmarks (a process's peak RSS, one value, no samples) drifted by 11-13 % between
# separate asv runs of identical code, so they count as a regression only beyond this factor.
PEAKMEM_FACTOR = 1.25
ERROR_EXIT = 2  # a usage or user error; 1 means a regression
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
    parser.add_argument("--factor", type=factor, default=DEFAULT_FACTOR,
                        help=f"flag a benchmark when HEAD is slower than BASE by more than this ratio and "
                             f"asv finds the difference significant (default {DEFAULT_FACTOR})")
    parser.add_argument("--bench", type=bench_regex, metavar="REGEX",
                        help="only benchmarks whose name matches REGEX (asv run --bench)")
    return parser


def judge(base_rows, head_rows, factor):
    """asv compare's verdict per benchmark point: ``(regressions, failures)``.

    regressions: ``[(name, ratio head/base)]`` where :func:`results.head_is_worse`
    with ``factor`` (for ``peakmem_`` benchmarks, at least PEAKMEM_FACTOR).
    failures: ``[(name, commit role)]`` where a stored value is None (a failed
    benchmark or correctness check), and where a point with a value at BASE is
    n/a at HEAD (:func:`results.vanished`, unless retired in benchmarks/common.py).
    Points whose benchmark code changed between the two (asv marks them x) are not compared.
    """
    base, head = results.unrolled(base_rows), results.unrolled(head_rows)
    regressions, failures = [], [(f"{label}  {VANISHED}", "head") for label in results.vanished(base, head)]
    for name in sorted(set(base) | set(head)):
        label = name[0]
        (value_1, ss_1, version_1), (value_2, ss_2, version_2) = (
            points.get(name, (math.nan, None, None)) for points in (base, head))
        failures += [(label, role) for role, value in (("base", value_1), ("head", value_2)) if value is None]
        if value_1 is None or value_2 is None or math.isnan(value_1) or math.isnan(value_2):
            continue
        if version_1 is not None and version_2 is not None and version_1 != version_2:
            continue
        peakmem = label.split("(")[0].rsplit(".", 1)[-1].startswith("peakmem_")
        if results.head_is_worse(value_1, value_2, ss_1, ss_2, max(factor, PEAKMEM_FACTOR) if peakmem else factor):
            regressions.append((label, value_2 / value_1 if value_1 else math.inf))
    return regressions, failures


def run(args):
    from asv.commands.compare import Compare

    commits = {role: common.resolve(name) for role, name in (("base", args.base), ("head", args.head))}
    if commits["base"] == commits["head"]:
        print(f"note: BASE and HEAD are the same commit {commits['head'][:8]}: the comparison is of its "
              "results with themselves")
    common.record_machine()
    results.quarantine_unreadable()
    common.asv_run(list(dict.fromkeys(commits.values())), *(["--bench", args.bench] if args.bench else []))
    conf, _, machine, env_names = results.asv_setup()
    rows = {role: results.compare_rows(conf, results.iter_results(conf, machine, commit, env_names), args.bench)
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
    if args.bench and results.drop_partial(conf, machine, env_names, set(commits.values()), args.bench):
        print("note: results of benchmarks measured here for only some parameter combinations were not kept, "
              "so that the main job measures them whole")
    for label, ratio in regressions:
        print(f"REGRESSION {ratio:.2f}x  {label}")
    for label, role in failures:
        print(f"FAILED at {role} {commits[role][:8]}  {label}")
    if any(label.endswith(VANISHED) for label, _ in failures):
        print(results.RETIRE_HINT)
    if missing or failures:
        print(f"gate: exit 2 ({len(failures)} failed benchmark point(s), {len(missing)} commit(s) without results, "
              f"{len(regressions)} regression(s) beyond {args.factor}x)")
        return 2
    if regressions:
        print(f"gate: exit 1 ({len(regressions)} benchmark point(s) slower than {args.factor}x and significant)")
        print(f"to check it is not noise, measure HEAD again: delete "
              f"{results.result_files(conf, machine, commits['head'])} and re-run this gate "
              "(on a machine shared with other jobs, use --factor 1.25)")
        return 1
    print(f"gate: exit 0 (nothing worse than {args.factor}x)")
    return 0
