"""tools/publish.py: asv's pages made to render offline (no npm, no network here), repository text as text."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import asv
import pytest

from tools import publish as dashboard

ASV_INDEX = Path(asv.__file__).parent / "www" / "index.html"


@pytest.fixture
def tool():
    return dashboard


@pytest.fixture
def fake_node_modules(tool, tmp_path):
    """A node_modules tree holding every file the tool copies, each containing its own path."""
    root = tmp_path / "node_modules"
    for spec, file in tool.CDN_FILES.values():
        path = root / spec.rsplit("@", 1)[0] / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"/* {path.relative_to(root)} */")
    (root / "bootstrap" / "dist" / "fonts").mkdir(parents=True)
    (root / "bootstrap" / "dist" / "fonts" / "glyphicons-halflings-regular.woff").write_text("font")
    return root


def external_addresses(html):
    return re.findall(r'(?:src|href)="(https?://[^"]+)"', html)


def test_every_external_script_and_stylesheet_of_asv_is_known(tool):
    html = ASV_INDEX.read_text()
    loaded = [url for url in external_addresses(html) if "github.com" not in url]  # the logo's link stays
    assert loaded and set(loaded) == set(tool.CDN_FILES)


def test_vendor_copies_the_files_and_leaves_no_cdn_address(tool, fake_node_modules, tmp_path):
    html_dir = tmp_path / "html"
    html_dir.mkdir()
    (html_dir / "index.html").write_text(ASV_INDEX.read_text())
    assert tool.vendor(html_dir, fake_node_modules) == len(tool.CDN_FILES)
    html = (html_dir / "index.html").read_text()
    assert [url for url in external_addresses(html) if "github.com" not in url] == []
    for source in re.findall(r'<script src="(vendor/[^"]+)"', html) + re.findall(r'href="(vendor/[^"]+)"', html):
        assert (html_dir / source).read_text().startswith("/* ")
    assert (html_dir / "vendor/bootstrap/dist/fonts/glyphicons-halflings-regular.woff").exists()
    assert html.count("<script") == ASV_INDEX.read_text().count("<script")
    assert html.count("</script>") == ASV_INDEX.read_text().count("</script>")


def test_an_unknown_address_is_refused_and_the_page_left_unchanged(tool, fake_node_modules, tmp_path):
    page = ASV_INDEX.read_text().replace("</head>", '<script src="https://example.invalid/x.js"></script></head>')
    (tmp_path / "index.html").write_text(page)
    with pytest.raises(tool.VendorError, match="example.invalid"):
        tool.vendor(tmp_path, fake_node_modules)
    assert (tmp_path / "index.html").read_text() == page


# --- repository text shown as text (tools/dashboard.py, issue 12) ----------------------------------

ASV_WWW = ASV_INDEX.parent
XSS = '<img/src="x"/onerror="alert(document.domain)">'


@pytest.fixture
def published(tmp_path):
    """A copy of the pages ``asv publish`` writes (asv's www directory)."""
    html_dir = tmp_path / "html"
    shutil.copytree(ASV_WWW, html_dir)
    return html_dir


# Each place asv 0.6.6 pasted repository text into HTML, as it reads there.
UNSAFE = {
    "graphdisplay.js": ["+ parts[j] +", "'\">' + name + '</li>'", "font-size:smaller;'>\" + tag + \"",
                        "details.push(key + ': ' + val)"],
    "summarygrid.js": ["href=\"#' + bm.name", "'<h1>' + group + '</h1>'", "'<div class=\"benchmark-text\">' + "],
    "summarylist.js": ["details.push(key + ': ' + val)"],
    "asv_ui.js": ["'<div class=\"panel-heading\">' + heading"],
}


def test_every_place_that_pasted_text_as_html_is_rewritten(published):
    originals = {name: (ASV_WWW / name).read_text() for name in UNSAFE}
    assert all(any(snippet in originals[name] for snippet in snippets) for name, snippets in UNSAFE.items())
    assert dashboard.neutralise(published) == 15
    for name, snippets in UNSAFE.items():
        text = (published / name).read_text()
        assert [s for s in snippets if s in text] == [], name
        assert text.count("html: true") == originals[name].count("html: true") - {
            "graphdisplay.js": 2, "summarygrid.js": 2}.get(name, 0)
    tags = (published / "graphdisplay.js").read_text()
    assert "kv_escape_html(tag)" in tags and tags.startswith("'use strict';\nfunction kv_escape_html(")


def test_the_escape_is_complete_when_run(published):
    """Run the inserted escape function in node, where there is one."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run JavaScript")
    script = dashboard.ESCAPE + f"process.stdout.write(kv_escape_html({json.dumps(XSS + '&' + chr(39))}));"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout
    assert out == "&lt;img/src=&quot;x&quot;/onerror=&quot;alert(document.domain)&quot;&gt;&amp;&#39;"


def test_neutralise_is_idempotent_and_refuses_another_asv(published):
    dashboard.neutralise(published)
    once = {p.name: p.read_bytes() for p in published.iterdir() if p.is_file()}
    dashboard.neutralise(published)
    assert {p.name: p.read_bytes() for p in published.iterdir() if p.is_file()} == once
    fresh = published.parent / "fresh"
    shutil.copytree(ASV_WWW, fresh)
    (fresh / "summarygrid.js").write_text((fresh / "summarygrid.js").read_text().replace("'<h1>'", "'<h2>'"))
    before = {p.name: p.read_bytes() for p in fresh.iterdir() if p.is_file()}
    with pytest.raises(dashboard.UnsafeDashboard, match="summarygrid.js holds 0 copies"):
        dashboard.neutralise(fresh)
    assert {p.name: p.read_bytes() for p in fresh.iterdir() if p.is_file()} == before  # nothing half-rewritten


def test_publish_removes_a_page_it_cannot_make_safe(tmp_path, monkeypatch):
    from tools import common

    monkeypatch.setattr(dashboard, "vendor", lambda html_dir: 0)
    (tmp_path / "index.html").write_text("<html><head><script></script></head></html>")
    with pytest.raises(common.UserError, match="not published"):
        dashboard.finish(tmp_path)
    assert not (tmp_path / "index.html").exists()


def test_the_regressions_page_rows_name_their_commits(tmp_path):
    (tmp_path / "index.json").write_text(json.dumps({"revision_to_hash": {"3": "c3", "5": "c5", "6": "c6"}}))
    (tmp_path / "regressions.json").write_text(json.dumps({"regressions": [
        ["b.T.time_x(16)", "graphs/b.json", {}, 0, 2.0, 1.0, [[None, 6, 1.0, 2.0]]],
        ["b.T.track_y", "graphs/c.json", {}, None, 3.0, 1.0, [[3, 5, 1.0, 1.5], [None, 6, 1.5, 3.0]]]]}))
    assert dashboard.regressions(tmp_path) == [("b.T.time_x(16)", None, "c6", 1.0, 2.0),
                                               ("b.T.track_y", "c3", "c5", 1.0, 1.5),
                                               ("b.T.track_y", None, "c6", 1.5, 3.0)]
