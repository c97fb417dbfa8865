"""tools/dashboard.py: asv's page rewritten to local copies of its CDN files (no npm, no network)."""

import re
from pathlib import Path

import asv
import pytest

from tools import dashboard

ASV_INDEX = Path(asv.__file__).parent / "www" / "index.html"


@pytest.fixture
def tool():
    return dashboard


@pytest.fixture
def fake_node_modules(tool, tmp_path):
    """A node_modules tree holding every file the tool copies, each containing its own path."""
    root = tmp_path / "node_modules"
    for spec, file in tool.CDN_FILES.values():
        path = root / tool.package_name(spec) / file
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


def test_missing_index_is_a_clear_error(tool, tmp_path):
    with pytest.raises(tool.VendorError, match="run asv publish first"):
        tool.vendor(tmp_path, tmp_path)
