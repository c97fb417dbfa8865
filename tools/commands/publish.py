"""``publish``: write the HTML dashboard from the results already stored, offline-ready; benchmarks nothing.

``asv publish`` writes ``.asv/html``; then :func:`finish` makes it the
dashboard this repository publishes: where npm is present, the page's
JavaScript and CSS are installed as npm packages under ``.asv/npm`` and copied
next to it (:mod:`tools.dashboard`), so that it renders without internet; each
graph opens on a view that shows its comparison; and every place where asv's
pages would insert a tag, branch, benchmark or machine name as HTML is rewritten
to insert text (:mod:`tools.dashboard_text`). The asv plugin
(:mod:`tools.asv_plugin`) calls :func:`finish` after every ``asv publish``, so
a plain ``asv publish``, this command and the main job write the same
dashboard: whatever a published dashboard needs goes into :func:`finish`.
"""

import argparse
import os
from pathlib import Path

from .. import combined, common, dashboard, dashboard_text

LOCKS_WORKSPACE = True  # one job at a time in .asv/ (tools/lock.py)

VIEW_COMMAND = ".venv/bin/python -m asv preview"  # serves .asv/html on 127.0.0.1 (tools/asv_plugin.py)


EXAMPLE = """example, this machine's results and the stored ones of docs/results in one dashboard:
  python3 tools/dev.py publish --with docs/results
  .venv/bin/python -m asv preview   # then choose a machine in the "machine" panel of a graph"""


def setup_arguments(subparsers):
    parser = subparsers.add_parser("publish", allow_abbrev=False, epilog=EXAMPLE,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   help="write the dashboard (.asv/html) from the stored results, offline-ready")
    parser.add_argument("--with", dest="with_dirs", action="append", default=[], metavar="RESULTS_DIR",
                        help="also publish every machine of this asv results directory (e.g. docs/results), "
                             "each under its own name, copied unchanged (tools/combined.py); repeatable")
    return parser


def finish(html_dir, say=print):
    """What follows asv's own publish of ``html_dir``: local JavaScript, default graph views, text kept text.

    ``say`` prints a line (the asv plugin passes asv's log). Raises UserError as
    :func:`make_safe` does.
    """
    html_dir = Path(html_dir)
    try:
        count = dashboard.vendor(html_dir)
        say(f"dashboard made offline-ready: its {count} external files are served from {html_dir / 'vendor'}")
    except dashboard.VendorError as error:
        say(f"dashboard keeps asv's CDN links (needs internet to render): {error}")
    views = dashboard.add_default_views(html_dir)
    say(f"dashboard graphs open on a view of their comparison: {views} benchmarks")
    count = make_safe(html_dir)
    say(f"dashboard shows tag, branch, benchmark and machine names as text ({count} places of asv's pages "
        "rewritten, and a Content-Security-Policy)")


def make_safe(html_dir):
    """:func:`tools.dashboard_text.neutralise`; if it cannot, ``index.html`` is removed (never served unsafe)."""
    try:
        return dashboard_text.neutralise(html_dir)
    except dashboard_text.UnsafeDashboard as error:
        (Path(html_dir) / "index.html").unlink(missing_ok=True)
        raise common.UserError(f"the dashboard was not published (index.html removed): it could not be made to "
                               f"show repository text as text: {error}") from None


def view_lines(html_dir):
    """How to view the dashboard in ``html_dir``: the command that serves it and the address it will print.

    The address is the one ``asv preview`` takes now (:func:`tools.asv_plugin.serve`: 127.0.0.1, the
    first free port from 8080): the page fetches its JSON, which browsers refuse from disk (file://).
    """
    from asv.util import UserError

    from .. import asv_plugin

    host = os.environ.get(asv_plugin.PREVIEW_HOST) or "127.0.0.1"
    try:
        server, _ = asv_plugin.serve(html_dir, host)
    except UserError as error:
        address = f"no address yet: {error}"
    else:
        address = asv_plugin._url(*server.server_address[:2])
        server.server_close()
    return (f"dashboard written to {html_dir}; opened from disk it shows \"Error fetching content\" (browsers "
            f"refuse to fetch its JSON from file://), so serve it:\n  {VIEW_COMMAND}\nand open {address}")


def publish():
    """``asv publish``, which the asv plugin follows with :func:`finish`."""
    common.run(*common.ASV, "publish")


def run(args):
    if not args.with_dirs:
        publish()
        print(view_lines(common.ROOT / ".asv" / "html"))
        return 0
    html, machines = combined.publish_together(args.with_dirs)
    print(f"dashboard of {len(machines)} machines written to {html}, each under its own name "
          "(choose one in the \"machine\" panel of a graph or of the summary list):")
    for name, source, files, graphs, left in machines:
        print(f"  {name}: {combined.files(files)} from {combined.shown(source)}{combined.left_out(left)}, "
              f"{graphs} benchmarks graphed"
              + ("" if graphs else " (none: its results are of other benchmark versions than benchmarks.json, "
                                   "or of commits on no branch asv publishes)"))
    print(view_lines(html))
    return 0
