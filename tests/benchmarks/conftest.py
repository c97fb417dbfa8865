"""Fixtures of the suite's tests."""

import pytest
from threadpoolctl import threadpool_limits

from benchmarks import common


@pytest.fixture
def one_thread(monkeypatch):
    """One BLAS thread, as under asv, and correctness checks that remember no earlier pass."""
    monkeypatch.setattr(common, "VERIFIED", set())
    with threadpool_limits(limits=1):
        yield
