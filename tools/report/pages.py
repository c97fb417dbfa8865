"""Render again every figure README.md and docs/*.md quote (``.venv/bin/python -m tools.report.pages``): a table
between ``<!-- rendered by: COMMAND -->`` and ``<!-- end of rendered -->``, an image after ``<!-- plotted by: COMMAND
-->``; COMMAND is a ``python3 tools/dev.py report`` command reading ``docs/results``.
"""

import contextlib
import io
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from .. import common, dev

PAGES = [common.ROOT / "README.md", *sorted((common.ROOT / "docs").glob("*.md"))]
RENDERED = re.compile(r"^<!-- rendered by: (.+?) -->\n(.*?)^<!-- end of rendered -->$", re.M | re.S)
PLOTTED = re.compile(r"^<!-- plotted by: (.+?) -->\n!\[[^\]]*\]\(([^)]+\.png)\)$", re.M)


def output(command):
    """What ``command`` (a ``python3 tools/dev.py ...`` line) prints."""
    argv = shlex.split(command)
    if argv[:3] != ["python3", "tools/dev.py", "report"]:
        raise common.UserError(f"not a report command: {command}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = dev.main(argv[2:])
    if status not in (0, None):
        raise common.UserError(f"{command} exited {status}")
    return out.getvalue()


def render(page):
    """``page``'s text with every rendered block replaced by its command's output; its images drawn again."""
    text = page.read_text()
    text = RENDERED.sub(lambda m: f"<!-- rendered by: {m[1]} -->\n{output(m[1])}<!-- end of rendered -->", text)
    for command, image in PLOTTED.findall(text):
        argv = shlex.split(command)
        with tempfile.TemporaryDirectory() as scratch:  # plots never write over a tracked file: copy it in
            argv[argv.index("--out") + 1] = scratch
            output(shlex.join(argv))
            shutil.copyfile(Path(scratch) / Path(image).name, common.ROOT / image)
    return text


def main():
    os.chdir(common.ROOT)  # the commands name docs/results relative to the repository
    os.environ[common.INSIDE_VENV] = "1"  # run inside .venv already: dev.main must not re-run itself
    for page in PAGES:
        text = render(page)
        if text != page.read_text():
            page.write_text(text)
            print(f"rendered {page.relative_to(common.ROOT)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except common.UserError as error:
        sys.exit(f"error: {error}")
