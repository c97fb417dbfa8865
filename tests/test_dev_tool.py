"""tools/dev.py: which commits the main job benchmarks, and its command line."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

DEV_PY = Path(__file__).resolve().parents[1] / "tools" / "dev.py"
PACKAGE = {"setup.cfg": "[metadata]", "pyproject.toml": "", "kv_attention/__init__.py": ""}


@pytest.fixture
def dev(monkeypatch, tmp_path):
    """tools/dev.py imported as a module, pointed at an empty git repository in tmp_path."""
    spec = importlib.util.spec_from_file_location("dev_tool", DEV_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q", "-b", "main"], check=True)

    def commit(message, files):
        for name, text in files.items():
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", message], check=True)
        return subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    module.commit = commit
    return module


def test_default_selection_is_main_main_1_and_library_commits_that_build(dev):
    readme = dev.commit("readme only: no package yet", {"README.md": "x"})
    build = dev.commit("package", PACKAGE)
    docs = [dev.commit(f"docs {i}", {"README.md": f"doc {i}"}) for i in range(3)]
    library = dev.commit("library", {"kv_attention/decode.py": "# change"})
    main_1 = dev.commit("docs again", {"README.md": "again"})
    main = dev.commit("tests", {"tests/test_x.py": "# test"})
    selected = dev.select_commits(whole_history=False)
    assert selected == [main, main_1, library, build]
    assert readme not in dev.select_commits(whole_history=True)
    assert dev.select_commits(whole_history=True) == [main, main_1, library, *docs[::-1], build]


def test_at_most_ten_library_commits_by_default(dev):
    dev.commit("package", PACKAGE)
    library = [dev.commit(f"lib {i}", {"kv_attention/a.py": str(i)}) for i in range(12)]
    assert dev.select_commits(whole_history=False) == library[::-1][:10]


def test_no_buildable_commit_is_a_clear_error(dev):
    dev.commit("readme", {"README.md": "x"})
    with pytest.raises(dev.JobError, match="no commit of main has a buildable package"):
        dev.select_commits(whole_history=True)


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["bench", "--bogus"], ["bench", "--al"]])
def test_bad_command_lines_exit_2_without_a_traceback(argv):
    result = subprocess.run([sys.executable, str(DEV_PY), *argv], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: tools/dev.py" in result.stderr and "Traceback" not in result.stderr
