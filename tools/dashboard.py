"""Make asv's published dashboard load its JavaScript and CSS from local copies, not CDNs.

asv 0.6's ``index.html`` loads jQuery, flot, flot-orderbars, stupidtable,
blueimp-md5 and bootstrap from public CDNs, so on a machine without internet
the page shows only an error banner. :func:`vendor` installs the same
libraries as npm packages into ``.asv/npm`` (never into the repository),
copies the files the page needs into ``<html_dir>/vendor/`` and rewrites the
page's ``<script>``/``<link>`` tags to them.

asv opens a benchmark's graph on the first values of its parameters (all of
the first parameter's values, then as many of the next as keep it within 8
lines) on a linear axis: for ``time_decode(T, strategy)`` that is every T of
``no_cache`` alone, whose 140 ms line flattens the others.
:func:`add_default_views` gives each graph a view that shows its comparison
instead: every value of the parameter it compares (``strategy``, ``path``),
the largest T, every value of the rest, on a log axis; and every graph a
labelled (date) x axis, as asv draws the commit axis without labels. A small
script in the page applies it when a graph is opened without a view of its own.

:func:`tools.commands.publish.finish` runs both after every ``asv publish``,
which rewrites index.html each time.
"""

import json
import re
import shutil
import urllib.parse
from pathlib import Path

from . import common, processes

# CDN address in asv 0.6.6's index.html -> (npm package@version, file in the package).
# stupid-table-plugin is on npm from 1.1.3 only (the CDN serves 1.0.1, same $.fn.stupidtable).
CDN_FILES = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery@3.3.1", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": ("flot@0.8.3", "jquery.flot.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": ("flot@0.8.3", "jquery.flot.time.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": (
        "flot@0.8.3", "jquery.flot.selection.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": (
        "flot@0.8.3", "jquery.flot.categories.js"),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": (
        "flot-orderbars@1.0.0", "js/jquery.flot.orderBars.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": (
        "stupid-table-plugin@1.1.3", "stupidtable.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": ("blueimp-md5@2.19.0", "js/md5.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": ("bootstrap@3.1.1", "dist/js/bootstrap.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": (
        "bootstrap@3.1.1", "dist/css/bootstrap.min.css"),
}
EXTRA_DIRS = {"bootstrap@3.1.1": ["dist/fonts"]}  # bootstrap.min.css loads ../fonts/glyphicons-*
TAG = re.compile(r'<(script|link)\b[^>]*?\b(?:src|href)="(https?://[^"]+)"[^>]*>')


class VendorError(Exception):
    """The dashboard could not be made to work offline; it keeps its CDN links."""


def package_name(spec):
    return spec.rsplit("@", 1)[0]


def npm_install(prefix=None):
    """``npm install`` every package of :data:`CDN_FILES` under ``prefix`` (default ``.asv/npm``); VendorError if npm fails."""
    prefix = prefix or common.ROOT / ".asv" / "npm"
    npm = shutil.which("npm")
    if npm is None:
        raise VendorError("npm not found: the dashboard keeps asv's CDN links and needs internet")
    prefix.mkdir(parents=True, exist_ok=True)
    specs = sorted({spec for spec, _ in CDN_FILES.values()})
    result = processes.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save", "--package-lock=false", *specs],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise VendorError(f"npm install failed: {result.stderr.strip()[-500:]}")
    return prefix / "node_modules"


def local_tag(kind, path):
    """The opening tag that replaces a CDN one: same kind, local ``path``, no integrity attribute."""
    if kind == "script":
        return f'<script src="{path}" onerror="js_load_failure()">'
    return f'<link rel="stylesheet" href="{path}">'


def rewrite_index(html, local_paths):
    """Return ``html`` with every CDN tag pointing at ``local_paths[url]``; VendorError on an unknown URL."""
    unknown = sorted({url for _, url in TAG.findall(html)} - set(local_paths))
    if unknown:
        raise VendorError(f"index.html loads addresses this script does not know: {', '.join(unknown)}")

    return TAG.sub(lambda match: local_tag(match.group(1), local_paths[match.group(2)]), html)


def vendor(html_dir, node_modules=None):
    """Copy the dashboard's dependencies into ``html_dir/vendor`` and point index.html at them.

    Returns the number of tags rewritten. Raises VendorError (page unchanged)
    when npm is missing or fails, or index.html has an unknown external address.
    """
    html_dir = Path(html_dir)
    index = html_dir / "index.html"
    if not index.exists():
        raise VendorError(f"{index} not found: run asv publish first")
    node_modules = Path(node_modules) if node_modules else npm_install()
    local_paths = {}
    for url, (spec, file) in CDN_FILES.items():
        source = node_modules / package_name(spec) / file
        if not source.exists():
            raise VendorError(f"{spec} has no {file}")
        target = html_dir / "vendor" / package_name(spec) / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        local_paths[url] = target.relative_to(html_dir).as_posix()
    for spec, dirs in EXTRA_DIRS.items():
        for folder in dirs:
            shutil.copytree(node_modules / package_name(spec) / folder,
                            html_dir / "vendor" / package_name(spec) / folder, dirs_exist_ok=True)
    html = index.read_text(encoding="utf-8")
    new_html = rewrite_index(html, local_paths)
    index.write_text(new_html, encoding="utf-8")
    return len(TAG.findall(html))



COMPARED = ("strategy", "path")  # parameters whose values a graph compares: all of them are shown
LONGEST = "T"  # shown at its largest value only
VIEWS_SCRIPT = "kv-attention-views.js"
VIEWS_JS = """// Written by tools/dashboard.py: the view each graph opens on when its address names none.
(function () {
  var views = %s;
  function apply(event) {
    var hash = window.location.hash;
    if (hash.indexOf("?") !== -1) { return; }
    var name = decodeURIComponent(hash.slice(1));
    if (!Object.prototype.hasOwnProperty.call(views, name)) { return; }
    if (event) { event.stopImmediatePropagation(); }  // asv's own handler sees the new address only
    window.location.replace(hash + "?" + views[name]);
  }
  window.addEventListener("hashchange", apply);
  apply(null);
})();
"""


def _number(text):
    try:
        return float(text)
    except ValueError:
        return float("-inf")


def default_view(benchmark):
    """The address query a graph of ``benchmark`` (an entry of asv's index.json) opens with.

    Every graph gets the date x axis (asv's only labelled one). A graph with a
    compared parameter also shows all of its values, the largest T and every
    value of the other parameters, on a log y axis.
    """
    query = [("x-axis-scale", "date")]
    names, params = benchmark.get("param_names") or [], benchmark.get("params") or []
    if any(name in COMPARED for name in names):
        query.append(("y-axis-scale", "log"))
        for name, values in zip(names, params):
            chosen = [max(values, key=_number)] if name == LONGEST and values else values
            query += [(f"p-{name}", value) for value in chosen]
    return "&".join(f"{urllib.parse.quote(k, safe='')}={urllib.parse.quote(v, safe='')}" for k, v in query)


def add_default_views(html_dir):
    """Write :data:`VIEWS_SCRIPT` for the benchmarks of ``html_dir/index.json`` and load it from index.html.

    Returns the number of benchmarks given a view. Idempotent.
    """
    html_dir = Path(html_dir)
    benchmarks = json.loads((html_dir / "index.json").read_text(encoding="utf-8")).get("benchmarks", {})
    views = {name: default_view(b) for name, b in sorted(benchmarks.items()) if isinstance(b, dict)}
    data = json.dumps(views, indent=1, sort_keys=True).replace("<", "\\u003c")  # no "</script>" can end it
    (html_dir / VIEWS_SCRIPT).write_text(VIEWS_JS % data, encoding="utf-8")
    index = html_dir / "index.html"
    html = index.read_text(encoding="utf-8")
    tag = f'<script src="{VIEWS_SCRIPT}"></script>'
    if tag not in html:
        index.write_text(html.replace("</title>", "</title>\n    " + tag, 1), encoding="utf-8")
    return len(views)
