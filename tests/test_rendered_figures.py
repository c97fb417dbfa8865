"""The figures README.md and docs/ quote are what ``tools/dev.py report`` renders from the stored results they name.

A quoted table sits between ``<!-- rendered by: COMMAND -->`` and
``<!-- end of rendered -->``; a quoted image follows ``<!-- plotted by: COMMAND -->``.
COMMAND is a ``python3 tools/dev.py report`` command whose ``--results-dir`` is
a directory of the repository holding the asv result files it was rendered from
(``docs/results/``), so every block can be rendered again on any clone
(``.venv/bin/python -m tools.report.pages``): a figure edited by hand, a report
that changed its output, or a result file replaced without rendering again fails here.
"""

import re
import shlex
from pathlib import Path

import pytest

from tools import common, dev
from tools.report import pages


def rendered_blocks():
    return [(page.name, command, text) for page in pages.PAGES
            for command, text in pages.RENDERED.findall(page.read_text())]


def plotted_images():
    return [(page.name, command, image) for page in pages.PAGES
            for command, image in pages.PLOTTED.findall(page.read_text())]


def test_the_readme_quotes_rendered_figures_only():
    assert {"README.md", "results.md"} <= {page for page, _, _ in rendered_blocks()}
    assert "README.md" in {page for page, _, _ in plotted_images()}
    for page in pages.PAGES:  # every marker that starts a line opens or closes a block, or names an image
        text = page.read_text()
        opened = re.findall(r"^<!-- rendered by:", text, re.M)
        closed = re.findall(r"^<!-- end of rendered -->", text, re.M)
        assert len(opened) == len(closed) == len(pages.RENDERED.findall(text)), page.name
        assert len(re.findall(r"^<!-- plotted by:", text, re.M)) == len(pages.PLOTTED.findall(text)), page.name


def results_dir(page, command):
    argv = shlex.split(command)
    assert argv[:3] == ["python3", "tools/dev.py", "report"], command
    path = Path(argv[argv.index("--results-dir") + 1])
    assert not path.is_absolute() and (common.ROOT / path).is_dir(), (
        f"{page}: {command}: --results-dir must name the repository's copy of the stored results")
    return argv


@pytest.mark.parametrize("page, command, text", rendered_blocks(), ids=lambda v: v[:60])
def test_a_rendered_block_is_what_its_command_prints(page, command, text, capsys, monkeypatch):
    argv = results_dir(page, command)
    monkeypatch.chdir(common.ROOT)
    monkeypatch.setenv(common.INSIDE_VENV, "1")
    assert dev.main(argv[2:]) == 0
    assert capsys.readouterr().out == text, (
        f"{page}: the quoted figures differ: run .venv/bin/python -m tools.report.pages")


@pytest.mark.parametrize("page, command, image", plotted_images(), ids=lambda v: v[:60])
def test_a_plotted_image_is_one_its_command_draws(page, command, image, tmp_path, monkeypatch, capsys):
    """The image is there, drawn by its command from the stored results (same size; pixels differ by font)."""
    matplotlib_image = pytest.importorskip("matplotlib.image")
    argv = results_dir(page, command)
    assert Path(argv[argv.index("--out") + 1]) == Path(image).parent, f"{page}: {image} is not in the --out folder"
    argv[argv.index("--out") + 1] = str(tmp_path)
    monkeypatch.chdir(common.ROOT)
    monkeypatch.setenv(common.INSIDE_VENV, "1")
    assert dev.main(argv[2:]) == 0
    quoted, drawn = (matplotlib_image.imread(p) for p in (common.ROOT / image, tmp_path / Path(image).name))
    assert quoted.shape == drawn.shape and quoted.std() > 0
