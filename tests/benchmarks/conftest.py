"""Fixtures of the suite's tests."""

import functools
import io
import json
from pathlib import Path

import pytest
from threadpoolctl import threadpool_limits

from benchmarks import common


@functools.lru_cache(maxsize=2)
def asv_listing(suite="benchmarks"):
    """``{name: attributes}`` of every benchmark of ``suite`` (``benchmarks`` or ``answers``, a directory of the
    repository) as asv lists it in benchmarks.json (asv_runner's discovery)."""
    discovery = pytest.importorskip("asv_runner.discovery")
    listed = io.StringIO()
    discovery.list_benchmarks(str(Path(common.__file__).parents[1] / suite), listed)
    return {b["name"]: b for b in json.loads(listed.getvalue())}


@pytest.fixture
def one_thread(monkeypatch):
    """One BLAS thread, as under asv, and correctness checks that remember no earlier pass."""
    monkeypatch.setattr(common, "VERIFIED", set())
    with threadpool_limits(limits=1):
        yield
