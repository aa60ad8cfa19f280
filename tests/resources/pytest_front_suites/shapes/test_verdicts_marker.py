"""What one rank reports outside the call's own outcome, in ``world``-marked tests run
on every rank (issue 29, cause 5): a subtest failing on rank 1, a strict xfail that
passes on rank 1 (the marker is true there only), a fixture failing its teardown on rank
1. Natively (torchrun, each rank its own pytest) each is a failure."""

import os

import pytest
import torch.distributed as dist

ON_RANK_ONE = os.environ.get("RANK") == "1"


@pytest.mark.world(2)
def test_subtest_fails_on_rank_one(subtests):
    for i in range(2):
        with subtests.test(i=i):
            assert not (dist.get_rank() == 1 and i == 1), "planted subtest failure"


@pytest.mark.world(2)
@pytest.mark.xfail(ON_RANK_ONE, reason="planted: rank 1 expects a failure", strict=True)
def test_strict_xfail_passes_on_rank_one():
    assert dist.get_world_size() == 2


@pytest.fixture
def fails_at_teardown():
    yield
    assert dist.get_rank() != 1, "planted teardown failure on rank 1"


@pytest.mark.world(2)
def test_teardown_fails_on_rank_one(fails_at_teardown):
    assert dist.get_world_size() == 2
