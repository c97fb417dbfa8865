"""``publish``: write the HTML dashboard from the results already stored, offline-ready; benchmarks nothing.

``asv publish`` writes ``.asv/html``; then, where npm is present, the page's
JavaScript and CSS are installed as npm packages under ``.asv/npm`` and copied
next to it (:mod:`tools.dashboard`), so that it renders without internet.
"""

from .. import common, dashboard


def setup_arguments(subparsers):
    return subparsers.add_parser("publish", allow_abbrev=False,
                                 help="write the dashboard (.asv/html) from the stored results, offline-ready")


def publish():
    """``asv publish``, then local copies of the page's JavaScript where npm is present."""
    common.run(*common.ASV, "publish")
    try:
        count = dashboard.vendor(common.ROOT / ".asv" / "html")
        print(f"dashboard made offline-ready: its {count} external files are served from .asv/html/vendor")
    except dashboard.VendorError as error:
        print(f"dashboard keeps asv's CDN links (needs internet to render): {error}")


def run(args):
    publish()
    print(f"dashboard written to {common.ROOT / '.asv' / 'html'}; view it on 127.0.0.1 with:\n"
          "  .venv/bin/python -m http.server --bind 127.0.0.1 --directory .asv/html 8080")
    return 0
