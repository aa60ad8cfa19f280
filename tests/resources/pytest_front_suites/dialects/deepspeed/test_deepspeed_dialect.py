"""DeepSpeed-style classes: a world_size attribute, the test method run on every rank."""

import pytest
import torch
import torch.distributed as dist
from harness import DistributedTest


@pytest.fixture
def scale():
    return 3.0


class TestPairOps(DistributedTest):
    world_size = 2

    def test_allreduce(self, scale):
        t = torch.tensor([scale * (dist.get_rank() + 1)])
        dist.all_reduce(t)
        assert t.item() == scale * 3

    def test_fails_on_rank_one(self):
        dist.barrier()
        assert dist.get_rank() != 1, "planted failure on rank 1"


class TestSizes(DistributedTest):
    world_size = [1, 2]  # noqa: RUF012 - DeepSpeed's own style: one world per size

    def test_size_matches(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size()
