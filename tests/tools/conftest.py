"""Fixtures of the commands' tests: a git repository of their own, which every command takes as the project."""

import subprocess
from types import SimpleNamespace

import pytest

from tools import common

PACKAGE = {"setup.cfg": "[metadata]", "pyproject.toml": "", "kv_attention/__init__.py": ""}  # a buildable commit


@pytest.fixture(autouse=True)
def inside_the_venv(monkeypatch):
    """``dev.main`` as ``tools/dev.py test`` runs it: inside .venv, so that a plain ``pytest`` is not replaced by the
    command it tests (dev.main re-executes itself in .venv otherwise)."""
    monkeypatch.setenv(common.INSIDE_VENV, "1")


@pytest.fixture
def repo(monkeypatch, tmp_path):
    """An empty git repository in tmp_path, made the commands' ``common.ROOT``.

    ``repo.commit(message, {path: text})`` writes the files, commits and returns the hash;
    ``repo.git(*args)`` runs git there.
    """
    monkeypatch.setattr(common, "ROOT", tmp_path)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]

    def run_git(*args):
        return subprocess.run(git + list(args), check=True, capture_output=True, text=True).stdout.strip()

    def commit(message, files):
        for name, text in files.items():
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        run_git("add", "-A")
        run_git("commit", "-q", "--allow-empty", "-m", message)
        return run_git("rev-parse", "HEAD")

    run_git("init", "-q", "-b", "main")
    return SimpleNamespace(root=tmp_path, commit=commit, git=run_git)
