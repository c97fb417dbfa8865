"""Fixtures of the library's tests: every strategy, and every multi-head function, in turn."""

import pytest

from ..references import BATCHED, SINGLE
from .helpers import HEADS_FUNCTIONS


@pytest.fixture(params=SINGLE + BATCHED)
def strategy(request):
    """Each registered strategy name in turn."""
    return request.param


@pytest.fixture(params=sorted(HEADS_FUNCTIONS))
def heads_function(request):
    """multi_head_attention, and multi_head_decode on each path."""
    return HEADS_FUNCTIONS[request.param]
