"""A quick test beside a slow one: Ctrl-C after the quick one finished (under --cpmatrix)."""

import time

import pytest
import torch.distributed as dist


@pytest.mark.world(2)
@pytest.mark.timeout(600)
def test_slow(rank):
    dist.barrier()
    time.sleep(600)


@pytest.mark.world(2)
def test_quick(rank):
    dist.barrier()
