"""``report {tables,csv,plots}``: the lab's tables, raw samples and plots from asv's stored results
(:mod:`tools.report`); it times nothing. Errors the user can fix print one line and exit 1."""

import argparse
import sys

from ..report import EXPERIMENTS, FIGURES
from ..results import ResultsDir, results_dir

def cmd_tables(args, results, machine):
    from ..report.tables import all_tables, describe, render_table

    run = results.load(machine, args.commit)
    lines = [f"## kv-attention decode benchmarks at `{run.commit[:8]}` on `{run.machine}`", "",
             *describe(run, args.experiment)]
    print("\n".join(lines + ["\n" + render_table(table) for table in all_tables(run, args.experiment)]))


def cmd_csv(args, results, machine):
    from ..report.samples import write_csv

    counts = write_csv(results, args.out, machine)
    print(f"wrote {counts['rows']} rows from {counts['points']} benchmark points in {counts['runs']} result files "
          f"to {'stdout' if args.out == '-' else args.out}", file=sys.stderr if args.out == "-" else sys.stdout)
    if counts["points_without_samples"]:
        print(f"note: {counts['points_without_samples']} points have no recorded samples and no rows: asv ran "
              "without --record-samples", file=sys.stderr)


def cmd_plots(args, results, machine):
    from ..report.plots import write_plots

    for path, replaced in write_plots(results.load(machine, args.commit), args.out, args.figure, lab=args.lab):
        print(f"{'replaced' if replaced else 'wrote'} {path}")


def setup_arguments(subparsers):
    parser = subparsers.add_parser("report", allow_abbrev=False, help="the lab's tables, csv and plots from "
                                   "the stored results", description="The lab's tables, samples and plots, read "
                                   "from asv's result files (times nothing).")
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--machine", help="asv machine name, a folder of the results (default: this host's, or the "
                        "only one)")
    shared.add_argument("--results-dir", help="asv results directory (default: asv.conf.json's results_dir)")
    newest = "git revision or hash prefix (default: the newest commit with results)"
    sub = parser.add_subparsers(dest="report_command", metavar="{tables,csv,plots}", required=True)
    t = sub.add_parser("tables", parents=[shared], help="the lab's tables for one commit, as Markdown")
    t.add_argument("--commit", help=newest)
    t.add_argument("--experiment", action="append", choices=EXPERIMENTS, metavar="NAME",
                   help=f"only this experiment's table ({', '.join(EXPERIMENTS)}); repeatable")
    s = sub.add_parser("csv", parents=[shared], help="every recorded timing sample, one row each")
    s.add_argument("--out", required=True, help="CSV file to write ('-' for stdout)")
    g = sub.add_parser("plots", parents=[shared], help="PNG figures for one commit (needs matplotlib)")
    g.add_argument("--out", required=True, help="directory for the PNG files")
    g.add_argument("--commit", help=newest)
    g.add_argument("--figure", action="append", choices=FIGURES, help="only this figure; repeatable")
    g.add_argument("--lab", action="store_true",
                   help="also draw the lab's own published figures (tools/report/lab.py), marked as the lab's")
    for command, function in ((t, cmd_tables), (s, cmd_csv), (g, cmd_plots)):
        command.set_defaults(report=function)
    return parser


def run(args):
    results = ResultsDir(args.results_dir or str(results_dir()))
    machine = results.pick_machine(args.machine)
    try:
        args.report(args, results, machine)
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        sys.stdout = None
    return 0
