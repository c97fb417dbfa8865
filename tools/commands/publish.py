"""``publish``: ``asv publish``, then the dashboard made to render offline and to show repository text as text.

asv 0.6.6's index.html loads jQuery, flot, bootstrap and the rest from CDNs: offline it shows only an error banner.
After ``asv publish``, the same libraries are installed from npm under ``.asv/npm``, copied into
``.asv/html/vendor`` and the page's tags pointed at them (without npm the page keeps asv's CDN links); then
:mod:`tools.dashboard_text` makes the pages insert repository text as text. asv publishes every machine of its
results folder (copy e.g. ``docs/results/vm-f980c2bd`` into ``.asv/results/`` to see it beside this one's).
"""

import re
import shutil
from pathlib import Path

from .. import common, dashboard_text

LOCKS_WORKSPACE = True
VIEW = ("dashboard written to .asv/html; serve it (browsers refuse its JSON from file://) with\n"
        "  .venv/bin/python -m asv preview\nand open the address it prints")

# CDN address in asv 0.6.6's index.html -> (npm package@version, file in the package).
# stupid-table-plugin is on npm from 1.1.3 only (the CDN serves 1.0.1, same $.fn.stupidtable).
FLOT, JSDELIVR = "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot", "https://cdn.jsdelivr.net/npm/"
CDN_FILES = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery@3.3.1", "dist/jquery.min.js"),
    **{f"{FLOT}{part}.min.js": ("flot@0.8.3", f"jquery.flot{part}.js")
       for part in ("", ".time", ".selection", ".categories")},
    f"{JSDELIVR}flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": ("flot-orderbars@1.0.0",
                                                                  "js/jquery.flot.orderBars.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": (
        "stupid-table-plugin@1.1.3", "stupidtable.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": ("blueimp-md5@2.19.0", "js/md5.min.js"),
    f"{JSDELIVR}bootstrap@3.1.1/dist/js/bootstrap.min.js": ("bootstrap@3.1.1", "dist/js/bootstrap.min.js"),
    f"{JSDELIVR}bootstrap@3.1.1/dist/css/bootstrap.min.css": ("bootstrap@3.1.1", "dist/css/bootstrap.min.css"),
}
EXTRA_DIRS = {"bootstrap@3.1.1": ["dist/fonts"]}  # bootstrap.min.css loads ../fonts/glyphicons-*
TAG = re.compile(r'<(script|link)\b[^>]*?\b(?:src|href)="(https?://[^"]+)"[^>]*>')


class VendorError(Exception):
    """The dashboard could not be made to work offline; it keeps its CDN links."""


def npm_install():
    """``npm install`` every package of :data:`CDN_FILES` under ``.asv/npm``; VendorError if npm fails."""
    prefix = common.ROOT / ".asv" / "npm"
    if all((prefix / "node_modules" / spec.rsplit("@", 1)[0] / file).is_file() for spec, file in CDN_FILES.values()):
        return prefix / "node_modules"  # installed by an earlier publish
    if shutil.which("npm") is None:
        raise VendorError("npm not found")
    prefix.mkdir(parents=True, exist_ok=True)
    specs = sorted({spec for spec, _ in CDN_FILES.values()})
    result = common.run("npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", "--no-save",
                        "--package-lock=false", *specs, check=False, capture=True)
    if result.returncode != 0:
        raise VendorError(f"npm install failed: {(result.stderr or '').strip()[-500:]}")
    return prefix / "node_modules"


def vendor(html_dir, node_modules=None):
    """Copy the dashboard's libraries into ``html_dir/vendor`` and point index.html at them; VendorError (the page
    unchanged) when npm fails or index.html loads an address not in :data:`CDN_FILES`."""
    index = Path(html_dir) / "index.html"
    html = index.read_text(encoding="utf-8")
    unknown = sorted({url for _, url in TAG.findall(html)} - set(CDN_FILES))
    if unknown:
        raise VendorError(f"index.html loads addresses this tool does not know: {', '.join(unknown)}")
    node_modules = Path(node_modules) if node_modules else npm_install()
    local = {}
    for url, (spec, file) in CDN_FILES.items():
        name = spec.rsplit("@", 1)[0]
        target = Path(html_dir) / "vendor" / name / file
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(node_modules / name / file, target)
            for folder in EXTRA_DIRS.get(spec, []):
                shutil.copytree(node_modules / name / folder, Path(html_dir) / "vendor" / name / folder,
                                dirs_exist_ok=True)
        except OSError as error:
            raise VendorError(f"{spec}: {error}") from None
        local[url] = target.relative_to(html_dir).as_posix()

    def tag(match):
        kind, url = match.groups()
        return (f'<script src="{local[url]}" onerror="js_load_failure()">' if kind == "script"
                else f'<link rel="stylesheet" href="{local[url]}">')

    index.write_text(TAG.sub(tag, html), encoding="utf-8")
    return len(local)


def finish(html_dir):
    """What follows ``asv publish``: local copies of the scripts, then repository text shown as text."""
    try:
        print(f"dashboard made offline-ready: {vendor(html_dir)} files served from {html_dir}/vendor")
    except VendorError as error:
        print(f"dashboard keeps asv's CDN links (needs internet to render): {error}")
    try:
        dashboard_text.neutralise(html_dir)
    except dashboard_text.UnsafeDashboard as error:
        (Path(html_dir) / "index.html").unlink(missing_ok=True)
        raise common.UserError(f"the dashboard was not published (index.html removed): it could not be made to "
                               f"show repository text as text: {error}") from None
    print("dashboard shows tag, branch, benchmark and machine names as text")


def publish():
    common.run(*common.ASV, "publish")
    finish(common.ROOT / ".asv" / "html")


def setup_arguments(subparsers):
    return subparsers.add_parser("publish", allow_abbrev=False,
                                 help="asv publish, then the dashboard made offline-ready and text kept text")


def run(args):
    publish()
    print(VIEW)
    return 0
