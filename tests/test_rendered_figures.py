"""The figures README.md and docs/ quote are what ``tools/dev.py report`` renders from the stored results they name.

A quoted block sits between ``<!-- rendered by: COMMAND -->`` and
``<!-- end of rendered -->``. COMMAND is a ``python3 tools/dev.py report``
command whose ``--results-dir`` is a directory of the repository holding the
asv result files it was rendered from (``docs/results/``), so the block can be
rendered again on any clone: a figure edited by hand, a report that changed its
output, or a result file replaced without re-rendering fails here.
"""

import re
import shlex
from pathlib import Path

import pytest

from tools import common, dev

PAGES = [common.ROOT / "README.md", *sorted((common.ROOT / "docs").glob("*.md"))]
RENDERED = re.compile(r"^<!-- rendered by: (.+?) -->\n(.*?)^<!-- end of rendered -->$", re.M | re.S)


def rendered_blocks():
    return [(page.name, command, text) for page in PAGES for command, text in RENDERED.findall(page.read_text())]


def test_the_readme_quotes_rendered_figures_only():
    pages = [page for page, _, _ in rendered_blocks()]
    assert "README.md" in pages and "results.md" in pages
    for page in PAGES:  # every marker that starts a line opens or closes a block
        text = page.read_text()
        opened = re.findall(r"^<!-- rendered by:", text, re.M)
        closed = re.findall(r"^<!-- end of rendered -->", text, re.M)
        assert len(opened) == len(closed) == len(RENDERED.findall(text)), page.name


@pytest.mark.parametrize("page, command, text", rendered_blocks(), ids=lambda v: v[:60])
def test_a_rendered_block_is_what_its_command_prints(page, command, text, capsys, monkeypatch):
    argv = shlex.split(command)
    assert argv[:3] == ["python3", "tools/dev.py", "report"], command
    results_dir = Path(argv[argv.index("--results-dir") + 1])
    assert not results_dir.is_absolute() and (common.ROOT / results_dir).is_dir(), (
        f"{page}: {command}: --results-dir must name the repository's copy of the stored results")
    monkeypatch.chdir(common.ROOT)
    monkeypatch.setenv(common.INSIDE_VENV, "1")
    assert dev.main(argv[2:]) == 0
    assert capsys.readouterr().out == text, f"{page}: the quoted figures differ: paste the output of `{command}`"
