"""Every command shown in the README and in docs/ is one its program accepts, and every Python example runs.

Shell lines are parsed by the parser of the program they call (tools/dev.py's,
asv's own), so a renamed command or option fails here; the behaviour of each
command is tested in tests/tools and by CI. Python blocks run as written.
"""

import re
import shlex
from pathlib import Path

import pytest

from tools import common, dev

PAGES = [common.ROOT / "README.md", *sorted((common.ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


def blocks(language):
    return [(page.name, text) for page in PAGES for lang, text in BLOCK.findall(page.read_text())
            if lang == language]


INLINE = re.compile(r"`(python3? tools/dev\.py [^`]+)`")  # an inline `asv compare` names a command, it runs none


def shell_lines():
    """Each command of a bash block (comments stripped) or of an inline `python3 tools/dev.py ...` span:
    ``(page, argv)``."""
    lines = []
    for page, text in blocks("bash"):
        lines += [(page, line.split(" # ")[0].strip()) for line in text.splitlines()]
    for page in PAGES:
        lines += [(page.name, span) for span in INLINE.findall(BLOCK.sub("", page.read_text()))]
    commands = [(page, part.strip()) for page, line in lines for part in line.split("&&")]
    return [(page, shlex.split(command)) for page, command in commands if command and not command.startswith("#")]


def asv_parser():
    from asv.commands import make_argparser

    return make_argparser()[0]


def test_the_pages_show_commands_and_examples():
    assert len(shell_lines()) >= 10 and len(blocks("python")) >= 3
    assert ["python3", "tools/dev.py", "bench"] in [argv for _, argv in shell_lines()]
    assert ["python3", "tools/dev.py", "test"] in [argv for _, argv in shell_lines()]


@pytest.mark.parametrize("page, argv", shell_lines(), ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_shown_command_is_accepted_by_its_program(page, argv):
    program = argv[:2] if argv[0].startswith("python") else argv[:1]
    if program == ["python3", "tools/dev.py"] or program == ["python", "tools/dev.py"]:
        dev.parse_args(argv[2:])  # SystemExit (exit 2) on a command or option that does not exist
    elif argv[1:3] == ["-m", "kv_attention"]:
        from kv_attention.__main__ import parse_args

        parse_args(argv[3:])
    elif program in (["asv"], [".venv/bin/asv"]):  # .venv/bin/asv: as typed on a fresh clone, without activating
        asv_parser().parse_args(argv[1:])
    elif argv[:3] in (["python3", "-m", "http.server"], ["python", "-m", "http.server"]):
        assert "--bind" in argv and argv[argv.index("--bind") + 1] == "127.0.0.1", "serve on loopback only"
        assert (common.ROOT / argv[argv.index("--directory") + 1]).parent.name == ".asv"
    else:
        pytest.fail(f"{page}: no test knows the program of {' '.join(argv)!r}")


@pytest.mark.parametrize("page, code", blocks("python"), ids=[f"{p}-{i}" for i, (p, _) in enumerate(blocks("python"))])
def test_every_python_example_runs(page, code):
    exec(compile(code, page, "exec"), {})


def test_the_readme_reads_in_five_minutes_and_answers_the_four_questions_first():
    text = (common.ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 150 and len(text) <= 12_000
    questions = [i for i, line in enumerate(lines, 1) if re.match(r"^#{2,3} [1-4]\. ", line)]
    assert len(questions) == 4 and max(questions) <= 80
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    paragraphs = re.split(r"\n\n|\n(?=- |#)", prose)  # a list item or a heading starts its own
    sentences = [s for line in paragraphs for s in re.split(r"(?<=[.!?])\s+", " ".join(line.split()))]
    assert max(len(s.split()) for s in sentences if not s.startswith(("|", "<!--"))) <= 45
    words = sum(len(page.read_text().split()) for page in sorted((common.ROOT / "docs").glob("*.md")))
    assert words <= 12_000


def test_the_readmes_dashboard_links_name_benchmarks_of_the_regression_suite():
    """Each link opens a graph asv publishes: a benchmark of benchmarks/, its x-axis one of its parameters."""
    import importlib

    links = re.findall(r"http://127\.0\.0\.1:8080/#([\w.]+)\?x-axis=(\w+)", (common.ROOT / "README.md").read_text())
    assert len(links) >= 4
    for name, axis in links:
        module, cls, method = name.split(".")
        benchmark = getattr(importlib.import_module(f"benchmarks.{module}"), cls)
        assert callable(getattr(benchmark, method)) and axis in benchmark.param_names, name
