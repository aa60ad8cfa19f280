"""A pytest target's smallest suite: collected without importing torch.

Two tests that need no ranks (each a cell of one rank in a matrix) and one that asks for
two; used by the loader's and the cell ids' tests (tests/resources/complete.yaml).
"""

import pytest


def test_one():
    assert 1 + 1 == 2


@pytest.mark.parametrize("x", ["a/b", "c d"])
def test_odd_ids(x):
    assert x


@pytest.mark.world(2)
def test_pair(rank):
    assert rank in (0, 1)
