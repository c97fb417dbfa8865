"""The main job's ``asv publish``, then the dashboard made to render offline and to show repository text as text.

asv 0.6.6's index.html loads its libraries from CDNs: :func:`vendor` copies them from npm into ``vendor/``. Its
pages paste tag, benchmark, parameter and machine names into HTML (``<img/src="x"/onerror=...>`` would run):
:func:`neutralise` rewrites each such place to insert text, or the page is not published.
"""

import json
import re
import shutil
from pathlib import Path

from . import common

VIEW = ("dashboard written to .asv/html; serve it (browsers refuse its JSON from file://) with\n"
        "  .venv/bin/asv preview\nand open the address it prints (asv publish remakes the folder: restart a preview left "
        "running)")

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
            if file.endswith("bootstrap.min.css"):  # it loads ../fonts/glyphicons-*
                shutil.copytree(node_modules / name / "dist/fonts", target.parent.parent / "fonts", dirs_exist_ok=True)
        except OSError as error:
            raise VendorError(f"{spec}: {error}") from None
        local[url] = target.relative_to(html_dir).as_posix()

    def tag(match):
        kind, url = match.groups()
        return (f'<script src="{local[url]}" onerror="js_load_failure()">' if kind == "script"
                else f'<link rel="stylesheet" href="{local[url]}">')

    index.write_text(TAG.sub(tag, html), encoding="utf-8")
    return len(local)


ESCAPE = ("function kv_escape_html(text) {  /* tools/publish.py: text, never markup */\n"
          "    return String(text).replace(/[&<>\"']/g, function (c) {\n"
          "        return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '\"': '&quot;', \"'\": '&#39;'}[c];\n"
          "    });\n"
          "}\n")
STRICT = "'use strict';\n"

# the machine tooltip: every field of machine.json
DETAILS = ("""                details.push(key + ': ' + val);""",
           """                details.push(kv_escape_html(key) + ': ' + kv_escape_html(val));""")


def as_text(title, indent):
    """A bootstrap tooltip of ``title`` inserted as text (``html: false``), as asv's code indents it."""
    old = f"{' ' * indent}title: {title},\n{' ' * indent}html: true,"
    return old, old.replace("html: true", "html: false")


# file -> [(asv 0.6.6's code, the code that inserts text instead)]
REWRITES = {
    "graphdisplay.js": [
        (STRICT, STRICT + ESCAPE),
        # the benchmark tree: a group name of a benchmark's dotted name
        ("""'<label class="nav-header"><b class="caret-right"/> ' + parts[j] +""",
         """'<label class="nav-header"><b class="caret-right"/> ' + kv_escape_html(parts[j]) +"""),
        # the benchmark tree: its link, and its code as a tooltip
        ("""var top = $('<li><a href="#' + bm_name + '">' + name + '</li>');""",
         """var top = $('<li/>').append($('<a/>').attr('href', '#' + bm_name).text(name));"""),
        as_text("bm.code", 16),
        as_text("contents", 20),  # a point's tooltip: value, unit (the benchmark's) and commit
        DETAILS,
        # the tag labels over the graph: git tag names
        ("""font-size:smaller;'>" + tag + "</div>");""",
         """font-size:smaller;'>" + kv_escape_html(tag) + "</div>");"""),
    ],
    "summarygrid.js": [
        (STRICT, STRICT + ESCAPE),
        ("""        var container = $(
            '<a class="btn benchmark-container" href="#' + bm.name +
            '"/>');
        var plot_div = $(
            '<div id="summarygrid-' + bm.name + '" class="benchmark-plot"/>');""",
         """        var container = $('<a class="btn benchmark-container"/>').attr('href', '#' + bm.name);
        var plot_div = $('<div class="benchmark-plot"/>').attr('id', 'summarygrid-' + bm.name);"""),
        ("""        var name = $('<div class="benchmark-text">' + display_name + '</div>');
        name.tooltip({
            title: bm.name,
            html: true,""",
         """        var name = $('<div class="benchmark-text"/>').text(display_name);
        name.tooltip({
            title: bm.name,
            html: false,"""),
        as_text("bm.code", 12),
        ("""group_container.append($('<h1>' + group + '</h1>'));""",
         """group_container.append($('<h1/>').text(group));"""),
    ],
    "summarylist.js": [
        (STRICT, STRICT + ESCAPE),
        DETAILS,
    ],
    "asv_ui.js": [
        # a panel's heading: a parameter name of a benchmark or of the machine
        ("""        var panel_header = $(
            '<div class="panel-heading">' + heading + '</div>');""",
         """        var panel_header = $('<div class="panel-heading"/>').text(heading);"""),
    ],
}


class UnsafeDashboard(Exception):
    """The published pages are not the asv 0.6.6 pages this module knows how to make safe."""


def rewrite(name, text):
    """``text`` of asv's ``name`` with every rewrite of :data:`REWRITES` applied; UnsafeDashboard if one is missing."""
    for old, new in REWRITES.get(name, []):
        if new in text and old not in text.replace(new, ""):
            continue  # rewritten already
        if text.count(old) != 1:
            raise UnsafeDashboard(f"{name} holds {text.count(old)} copies of a place this tool rewrites (expected 1: "
                                  f"asv 0.6.6's): {old.strip()[:80]!r}")
        text = text.replace(old, new)
    return text


def neutralise(html_dir):
    """Make the dashboard in ``html_dir`` (as ``asv publish`` wrote it, then vendored) insert repository text as
    text; the number of places made safe. Nothing is written unless every rewrite applies; idempotent."""
    html_dir = Path(html_dir)
    files = {name: html_dir / name for name in REWRITES}
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:
        raise UnsafeDashboard(f"{html_dir} lacks {', '.join(missing)}: run asv publish first")
    new = {name: rewrite(name, path.read_text(encoding="utf-8")) for name, path in files.items()}
    for name, text in new.items():
        files[name].write_text(text, encoding="utf-8")
    return sum(len(changes) for changes in REWRITES.values())


def finish(html_dir):
    """What follows ``asv publish``: local copies of the scripts, then repository text shown as text."""
    try:
        print(f"dashboard made offline-ready: {vendor(html_dir)} files served from its vendor/ folder")
    except VendorError as error:
        print(f"dashboard keeps asv's CDN links (needs internet to render): {error}")
    try:
        neutralise(html_dir)
    except UnsafeDashboard as error:
        (Path(html_dir) / "index.html").unlink(missing_ok=True)
        raise common.UserError(f"the dashboard was not published (index.html removed): it could not be made to "
                               f"show repository text as text: {error}") from None
    print("dashboard shows tag, branch, benchmark and machine names as text")


def publish():
    """``asv publish`` into ``.asv/html``, then :func:`finish` there."""
    html = common.ROOT / ".asv" / "html"
    common.run(*common.ASV, "publish", "--html-dir", html)
    finish(html)


def regressions(html_dir):
    """The Regressions page's rows (``regressions.json``), one per jump: ``[(label, first commit or None, last commit,
    value before, value after)]``, the jump in ``first..last``, or at ``last`` where ``first`` is None."""
    html_dir = Path(html_dir)
    rows = json.loads((html_dir / "regressions.json").read_text())["regressions"]
    commit = {int(k): v for k, v in json.loads((html_dir / "index.json").read_text())["revision_to_hash"].items()}
    return [(label, commit.get(first), commit[last], before, after)
            for label, _graph, _params, _index, _latest, _best, jumps in rows for first, last, before, after in jumps]
