"""DeepSpeed-style tests that use a group the library made once and kept (as
``deepspeed.initialize`` does with its clone of the world group): natively each test has
fresh processes, so each test's library makes its own."""

import deepspeed
import torch
import torch.distributed as dist
from harness import DistributedTest


def _use_the_kept_group():
    group = deepspeed.comm.world_clone()
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    assert t.item() == 2
    assert dist.get_global_rank(group, 1) == 1


class TestKeptGroup(DistributedTest):
    world_size = 2

    def test_first_makes_it(self):
        _use_the_kept_group()

    def test_second_makes_its_own(self):
        _use_the_kept_group()
