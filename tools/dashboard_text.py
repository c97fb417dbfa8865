"""The published dashboard shows text from the repository and the result files as text, never as markup.

asv 0.6.6's pages paste tag names, benchmark names and code, parameter names and machine details into HTML, so a
git tag such as ``<img/src="x"/onerror="alert(document.domain)">`` runs script in every visitor's browser.
:func:`neutralise` rewrites each such place to insert text (each rewrite must find asv 0.6.6's code exactly once)
and adds a Content-Security-Policy allowing no inline script but asv's own.
"""

import base64
import hashlib
import re
from pathlib import Path

ESCAPE = ("function kv_escape_html(text) {  /* tools/dashboard_text.py: text, never markup */\n"
          "    return String(text).replace(/[&<>\"']/g, function (c) {\n"
          "        return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '\"': '&quot;', \"'\": '&#39;'}[c];\n"
          "    });\n"
          "}\n")
STRICT = "'use strict';\n"

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
        ("""                title: bm.code,
                html: true,""",
         """                title: bm.code,
                html: false,"""),
        # a point's tooltip: value, unit (the benchmark's) and commit
        ("""                    title: contents,
                    html: true,""",
         """                    title: contents,
                    html: false,"""),
        # the machine tooltip: every field of machine.json
        ("""                details.push(key + ': ' + val);""",
         """                details.push(kv_escape_html(key) + ': ' + kv_escape_html(val));"""),
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
        ("""            title: bm.code,
            html: true,""",
         """            title: bm.code,
            html: false,"""),
        ("""group_container.append($('<h1>' + group + '</h1>'));""",
         """group_container.append($('<h1/>').text(group));"""),
    ],
    "summarylist.js": [
        (STRICT, STRICT + ESCAPE),
        ("""                details.push(key + ': ' + val);""",
         """                details.push(kv_escape_html(key) + ': ' + kv_escape_html(val));"""),
    ],
    "asv_ui.js": [
        # a panel's heading: a parameter name of a benchmark or of the machine
        ("""        var panel_header = $(
            '<div class="panel-heading">' + heading + '</div>');""",
         """        var panel_header = $('<div class="panel-heading"/>').text(heading);"""),
    ],
}
# the one inline script and the one inline handler of asv 0.6.6's index.html
INLINE_SCRIPT = re.compile(r"<script type=\"text/javascript\">(.*?)</script>", re.S)
INLINE_HANDLER = "js_load_failure()"
SCRIPT_SOURCES = re.compile(r'<(?:script|link)\b[^>]*?\b(?:src|href)="(https?://[^/"]+)/')


class UnsafeDashboard(Exception):
    """The published pages are not the asv 0.6.6 pages this module knows how to make safe."""


def _sha256(text):
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def policy(index_html):
    """The Content-Security-Policy for ``index_html``: scripts from this server (and the CDNs it loads), no inline
    script but asv's own and its load-failure handler, no plugins, images from this server only."""
    hosts = " ".join(sorted(set(SCRIPT_SOURCES.findall(index_html))))
    inline = " ".join([_sha256(m) for m in INLINE_SCRIPT.findall(index_html)] + [_sha256(INLINE_HANDLER)])
    return " ".join(f"default-src 'self'; script-src 'self' {hosts} 'unsafe-hashes' {inline}; style-src 'self' "
                    f"'unsafe-inline' {hosts}; font-src 'self' {hosts}; img-src 'self' data:; object-src 'none'; "
                    "base-uri 'none'; form-action 'none'".split()).replace(" ;", ";")


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
    files = {name: html_dir / name for name in [*REWRITES, "index.html"]}
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:
        raise UnsafeDashboard(f"{html_dir} lacks {', '.join(missing)}: run asv publish first")
    new = {name: rewrite(name, path.read_text(encoding="utf-8")) for name, path in files.items() if name in REWRITES}
    index = files["index.html"].read_text(encoding="utf-8")
    if "Content-Security-Policy" not in index:  # a <meta> before the first script, where it applies from
        if "<script" not in index or index.index("<script") < index.find("<head>"):
            raise UnsafeDashboard("index.html has no script in its <head>")
        meta = f'<meta http-equiv="Content-Security-Policy" content="{policy(index)}">\n    '
        new["index.html"] = index.replace("<script", meta + "<script", 1)
    for name, text in new.items():
        files[name].write_text(text, encoding="utf-8")
    return sum(len(changes) for changes in REWRITES.values())
