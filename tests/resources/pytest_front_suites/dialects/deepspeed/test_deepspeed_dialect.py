"""DeepSpeed-style classes: a world_size attribute, the test method run on every rank."""

import os

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


class TestLauncherEnvironment(DistributedTest):
    world_size = 2

    def test_local_size_and_the_group(self):
        assert os.environ["LOCAL_SIZE"] == "2"
        assert dist.is_initialized() and dist.get_world_size() == 2


class TestWithoutInit(DistributedTest):
    world_size = 2
    init_distributed = False

    def test_no_group_is_made(self):
        assert not dist.is_initialized()
        assert os.environ["WORLD_SIZE"] == "2"


class TestWorldSizeMarker(DistributedTest):
    world_size = 2

    @pytest.mark.world_size(1)
    def test_one_rank(self):
        assert dist.get_world_size() == 1
