"""Command line of the report: ``python -m benchmarks.report {tables,compare,csv,plots}``.

Errors the user can fix print one line to stderr and exit 1; usage errors exit 2 (argparse).
"""

import argparse
import json
import os
import sys

from .results import ReportError, ResultsDir

DEFAULT_CONFIG = "asv.conf.json"


def _results_dir(args):
    """``--results-dir`` if given, else asv.conf.json's ``results_dir`` (relative to that file)."""
    if args.results_dir:
        return args.results_dir, "."
    try:
        from asv.util import load_json

        conf = load_json(args.config, js_comments=True)
    except Exception as exc:  # asv raises UserError for a missing or malformed file
        raise ReportError(f"cannot read asv config {args.config}: {exc}") from None
    root = os.path.dirname(os.path.abspath(args.config))
    return os.path.join(root, conf.get("results_dir", "results")), root


def _open(args):
    path, repo = _results_dir(args)
    results = ResultsDir(path, repo_dir=repo)
    return results, results.pick_machine(args.machine)


def _run(results, machine, rev, env):
    return results.load(machine, None if rev is None else results.resolve(rev, machine), env)


def cmd_tables(args):
    from .tables import all_tables, describe, render_table

    results, machine = _open(args)
    run = _run(results, machine, args.commit, args.env)
    print(f"## kv-attention decode benchmarks at `{run.commit[:8]}` on `{run.machine}`\n")
    print("\n".join(describe(run)))
    for table in all_tables(run):
        print("\n" + render_table(table))


def _label(rev, run):
    """``HEAD~1 (0b6072e7)``, or just the hash when ``rev`` already is one."""
    short = run.commit[:8]
    return short if run.commit.startswith(rev.lower()) else f"{rev} ({short})"


def cmd_compare(args):
    from .tables import all_tables, describe, render_compare

    results, machine = _open(args)
    base = _run(results, machine, args.base, args.env)
    head = _run(results, machine, args.head, args.env)
    labels = tuple(_label(rev, run) for rev, run in ((args.base, base), (args.head, head)))
    print(f"## {labels[0]} vs {labels[1]} on `{machine}`\n")
    for label, run in zip(labels, (base, head)):
        print(f"{label}:\n" + "\n".join(describe(run)) + "\n")
    print("Last column: HEAD / BASE. Above 1 is slower for times, better for speedups, "
          "positions / s and scaling.")
    for base_table, head_table in zip(all_tables(base), all_tables(head)):
        print("\n" + render_compare(base_table, head_table, *labels))


def cmd_csv(args):
    from .samples import write_csv

    results, machine = _open(args) if args.machine else (_open_all(args), None)
    try:
        counts = write_csv(results, args.out, machine)
    except OSError as exc:
        raise ReportError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {counts['rows']} rows from {counts['points']} benchmark points "
          f"in {counts['runs']} result files to {args.out}")
    if counts["points_without_samples"]:
        print(f"note: {counts['points_without_samples']} points have no recorded samples "
              "(asv ran without --record-samples); their rows hold asv's median, quartiles "
              "and 99 % confidence bounds instead (column 'statistic')", file=sys.stderr)


def _open_all(args):
    path, repo = _results_dir(args)
    return ResultsDir(path, repo_dir=repo)


def cmd_plots(args):
    from .plots import write_plots

    results, machine = _open(args)
    run = _run(results, machine, args.commit, args.env)
    for path in write_plots(run, args.out):
        print(f"wrote {path}")


def parser():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description="The lab's tables, samples and plots, read from asv's result files (times nothing).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--machine", help="asv machine name (default: this host's, or the only one)")
    common.add_argument("--env", help="part of the asv environment name, if a commit has several")
    common.add_argument("--config", default=DEFAULT_CONFIG, help="asv config (default: %(default)s)")
    common.add_argument("--results-dir", help="asv results directory (default: the config's results_dir)")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tables", parents=[common], help="the three tables for one commit, as Markdown")
    t.add_argument("--commit", help="git revision or hash prefix (default: the newest commit with results)")
    t.set_defaults(func=cmd_tables)
    c = sub.add_parser("compare", parents=[common], help="two commits' tables side by side, with ratios")
    c.add_argument("base", help="BASE: git revision or hash prefix")
    c.add_argument("head", help="HEAD: git revision or hash prefix")
    c.set_defaults(func=cmd_compare)
    s = sub.add_parser("csv", parents=[common], help="every recorded timing sample, one row each")
    s.add_argument("--out", required=True, help="CSV file to write")
    s.set_defaults(func=cmd_csv)
    g = sub.add_parser("plots", parents=[common], help="PNG figures for one commit (needs matplotlib)")
    g.add_argument("--out", required=True, help="directory for the PNG files")
    g.add_argument("--commit", help="git revision or hash prefix (default: the newest commit with results)")
    g.set_defaults(func=cmd_plots)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except ReportError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into head
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
