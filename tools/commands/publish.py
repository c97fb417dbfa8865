"""``publish``: write the HTML dashboard from the results already stored, offline-ready; benchmarks nothing.

``asv publish`` writes ``.asv/html``; then, where npm is present, the page's
JavaScript and CSS are installed as npm packages under ``.asv/npm`` and copied
next to it (:mod:`tools.dashboard`), so that it renders without internet; then
every place where asv's pages would insert a tag, branch, benchmark or machine
name as HTML is rewritten to insert text (:mod:`tools.dashboard_text`).
"""

from .. import common, dashboard, dashboard_text

LOCKS_WORKSPACE = True  # one job at a time in .asv/ (tools/lock.py)


def setup_arguments(subparsers):
    return subparsers.add_parser("publish", allow_abbrev=False,
                                 help="write the dashboard (.asv/html) from the stored results, offline-ready")


def publish():
    """``asv publish``, then local copies of the page's JavaScript where npm is present, then text kept text."""
    common.run(*common.ASV, "publish")
    html_dir = common.ROOT / ".asv" / "html"
    try:
        count = dashboard.vendor(html_dir)
        print(f"dashboard made offline-ready: its {count} external files are served from .asv/html/vendor")
    except dashboard.VendorError as error:
        print(f"dashboard keeps asv's CDN links (needs internet to render): {error}")
    make_safe(html_dir)


def make_safe(html_dir):
    """:func:`tools.dashboard_text.neutralise`; if it cannot, the page is removed (never served unsafe)."""
    try:
        count = dashboard_text.neutralise(html_dir)
    except dashboard_text.UnsafeDashboard as error:
        (html_dir / "index.html").unlink(missing_ok=True)
        raise common.UserError(f"the dashboard was not published (index.html removed): it could not be made to "
                               f"show repository text as text: {error}") from None
    print(f"dashboard shows tag, branch, benchmark and machine names as text ({count} places of asv's pages "
          "rewritten, and a Content-Security-Policy)")


def run(args):
    publish()
    print(f"dashboard written to {common.ROOT / '.asv' / 'html'}; view it on 127.0.0.1 with:\n"
          "  .venv/bin/python -m http.server --bind 127.0.0.1 --directory .asv/html 8080")
    return 0
