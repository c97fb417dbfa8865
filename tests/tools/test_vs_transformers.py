"""tools/vs_transformers.py: without torch and transformers (never dependencies here) it skips in one line."""

import importlib.util
import subprocess
import sys

import pytest

from tools import common


def test_without_torch_the_comparison_prints_skipped_and_exits_0():
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        pytest.skip("torch and transformers are installed: the comparison would run for minutes")
    done = subprocess.run([sys.executable, "tools/vs_transformers.py"], cwd=common.ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("SKIPPED: the comparison needs torch and transformers (")
    assert done.stdout.count("\n") == 1
