"""``publish``: write the HTML dashboard from the results already stored, offline-ready; benchmarks nothing.

``asv publish`` writes ``.asv/html``; then :func:`finish` makes it the
dashboard this repository publishes: where npm is present, the page's
JavaScript and CSS are installed as npm packages under ``.asv/npm`` and copied
next to it (:mod:`tools.dashboard`), so that it renders without internet, and
each graph opens on a view that shows its comparison. The asv plugin
(:mod:`tools.asv_plugin`) calls :func:`finish` after every ``asv publish``, so
a plain ``asv publish``, this command and the main job write the same
dashboard: whatever a published dashboard needs goes into :func:`finish`.
"""

from pathlib import Path

from .. import common, dashboard

VIEW_COMMAND = ".venv/bin/python -m asv preview   # serves .asv/html on 127.0.0.1"


def setup_arguments(subparsers):
    return subparsers.add_parser("publish", allow_abbrev=False,
                                 help="write the dashboard (.asv/html) from the stored results, offline-ready")


def finish(html_dir, say=print):
    """What follows asv's own publish of ``html_dir``: local copies of its JavaScript, default graph views.

    ``say`` prints a line (the asv plugin passes asv's log).
    """
    html_dir = Path(html_dir)
    try:
        count = dashboard.vendor(html_dir)
        say(f"dashboard made offline-ready: its {count} external files are served from {html_dir / 'vendor'}")
    except dashboard.VendorError as error:
        say(f"dashboard keeps asv's CDN links (needs internet to render): {error}")
    views = dashboard.add_default_views(html_dir)
    say(f"dashboard graphs open on a view of their comparison: {views} benchmarks")


def publish():
    """``asv publish``, which the asv plugin follows with :func:`finish`."""
    common.run(*common.ASV, "publish")


def run(args):
    publish()
    print(f"dashboard written to {common.ROOT / '.asv' / 'html'}; view it with:\n  {VIEW_COMMAND}")
    return 0
