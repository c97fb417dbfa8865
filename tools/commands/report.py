"""``report {tables,compare,csv,plots}``: the lab's tables, raw samples and plots from asv's stored results
(:mod:`tools.report`); it times nothing. Errors the user can fix print one line and exit 1."""

import argparse
import os
import sys

from ..common import UserError, checked
from ..report import EXPERIMENTS
from ..results import ResultsDir, read_json

DEFAULT_CONFIG = "asv.conf.json"
MACHINE = checked(str, lambda text: 0 < len(text) <= 200 and "/" not in text and text.isprintable(),
                  "1-200 characters without '/' or control characters (a machine.json's name, never a path)")


def _open(args):
    """The results directory (``--results-dir`` or the config's ``results_dir``) and the machine."""
    path, repo = args.results_dir, "."
    if not path:
        conf = read_json(args.config, f"asv config {args.config}")
        if not isinstance(conf, dict) or not isinstance(conf.get("results_dir", "results"), str):
            raise UserError(f"cannot read asv config {args.config}: not an object with a string results_dir")
        root = os.path.dirname(os.path.abspath(args.config))
        path = os.path.join(root, conf.get("results_dir", "results"))
        repo = os.path.join(root, conf["repo"]) if isinstance(conf.get("repo"), str) else root
    results = ResultsDir(path, repo_dir=repo)
    machine = results.pick_machine(args.machine) if args.machine or args.report_command != "csv" else None
    return results, machine


def _run(results, machine, rev, env):
    return results.load(machine, rev, env)


def cmd_tables(args):
    from ..report.tables import all_tables, describe, render_table

    results, machine = _open(args)
    run = _run(results, machine, args.commit, args.env)
    lines = [f"## kv-attention decode benchmarks at `{run.commit[:8]}` on `{run.machine}`", "",
             *describe(run, args.experiment)]
    lines += ["\n" + render_table(table) for table in all_tables(run, args.experiment)]
    print("\n".join(lines))


def _label(rev, run):
    """``HEAD~1 (0b6072e7)``, or just the hash when ``rev`` already is one."""
    short = run.commit[:8]
    return short if run.commit.startswith(rev.lower()) else f"{rev} ({short})"


def cmd_compare(args):
    from ..report.tables import all_tables, describe, render_compare

    results, machine = _open(args)
    base = _run(results, machine, args.base, args.env)
    head = _run(results, machine, args.head, args.env)
    labels = tuple(_label(rev, run) for rev, run in ((args.base, base), (args.head, head)))
    lines = [f"## {labels[0]} vs {labels[1]} on `{machine}`", ""]
    for label, run in zip(labels, (base, head)):
        lines += [f"{label}:", *describe(run, args.experiment), ""]
    lines.append("Last column: head / base. For a time (ms, µs) above 1 is slower; for a speedup, "
                 "positions / s, scaling or a ratio such as no_cache / preallocated above 1 is larger.")
    lines += ["\n" + render_compare(b, h, *labels)
              for b, h in zip(all_tables(base, args.experiment), all_tables(head, args.experiment))]
    print("\n".join(lines))


def cmd_csv(args):
    from ..report.samples import write_csv

    results, machine = _open(args)
    counts = write_csv(results, args.out, machine, args.env)
    where = "stdout" if args.out == "-" else args.out
    if counts.get("replaced"):
        print(f"replaced the existing file {args.out}")
    print(f"wrote {counts['rows']} rows from {counts['points']} benchmark points "
          f"in {counts['runs']} result files to {where}", file=sys.stderr if args.out == "-" else sys.stdout)
    if counts["points_without_samples"]:
        print(f"note: {counts['points_without_samples']} points have no recorded samples "
              "(asv ran without --record-samples); their rows hold asv's median, quartiles "
              "and 99 % confidence bounds instead (column 'statistic')", file=sys.stderr)


def cmd_plots(args):
    from ..report.plots import write_plots

    results, machine = _open(args)
    run = _run(results, machine, args.commit, args.env)
    for path, replaced in write_plots(run, args.out, lab=args.lab, protected=results.paths):
        print(f"{'replaced' if replaced else 'wrote'} {path}")


def setup_arguments(subparsers):
    parser = subparsers.add_parser("report", allow_abbrev=False, help="the lab's tables, compare, csv and plots from "
                                   "the stored results", description="The lab's tables, samples and plots, read "
                                   "from asv's result files (times nothing).")
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--machine", type=MACHINE, help="asv machine name (default: this host's, or the only one)")
    shared.add_argument("--env", help="part of the asv environment name, if a commit has several")
    shared.add_argument("--config", default=DEFAULT_CONFIG, help="asv config (default: %(default)s)")
    shared.add_argument("--results-dir", help="asv results directory (default: the config's results_dir)")
    tables = argparse.ArgumentParser(add_help=False, parents=[shared])
    tables.add_argument("--experiment", action="append", choices=EXPERIMENTS, metavar="NAME",
                        help=f"only this experiment's table ({', '.join(EXPERIMENTS)}); repeatable")
    newest = "git revision or hash prefix (default: the newest commit with results)"
    sub = parser.add_subparsers(dest="report_command", metavar="{tables,compare,csv,plots}", required=True)
    t = sub.add_parser("tables", parents=[tables], help="the lab's tables for one commit, as Markdown")
    t.add_argument("--commit", help=newest)
    c = sub.add_parser("compare", parents=[tables], help="two commits' tables side by side, with ratios")
    c.add_argument("base", help="BASE: git revision or hash prefix")
    c.add_argument("head", help="HEAD: git revision or hash prefix")
    s = sub.add_parser("csv", parents=[shared], help="every recorded timing sample, one row each")
    s.add_argument("--out", required=True, help="CSV file to write ('-' for stdout)")
    g = sub.add_parser("plots", parents=[shared], help="PNG figures for one commit (needs matplotlib)")
    g.add_argument("--out", required=True, help="directory for the PNG files")
    g.add_argument("--commit", help=newest)
    g.add_argument("--lab", action="store_true",
                   help="also draw the lab's own published figures (tools/report/lab.py), marked as the lab's")
    for command, function in ((t, cmd_tables), (c, cmd_compare), (s, cmd_csv), (g, cmd_plots)):
        command.set_defaults(report=function)
    return parser


def run(args):
    try:
        args.report(args)
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        sys.stdout = None
    return 0
