"""A rank that fails or skips while its peer waits for it in a collective (issue 29's
cost): natively torch's harness ends the waiting rank when the failing one exits; with
``--cpmatrix`` the peer is told at once and the world goes on to the next test."""

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class CutOff(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_a_fails_on_rank_one_while_peer_waits(self):
        if self.rank == 1:
            raise AssertionError("planted: rank 1 fails before the collective")
        dist.all_reduce(torch.ones(1))

    # Natively rank 1 waits out its group's timeout (then fails): not run natively.
    @pytest.mark.timeout(60)
    @with_comms
    def test_b_skips_on_rank_zero_while_peer_waits(self):
        if self.rank == 0:
            self.skipTest("planted: rank 0 only")
        dist.all_reduce(torch.ones(1))

    @with_comms
    def test_c_passes_after_them(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2
