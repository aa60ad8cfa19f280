"""What one rank reports outside the call's own outcome, in torch's harness (issue 29,
cause 5): a subtest failing on rank 1 only, and an expected failure raised on rank 0
while rank 1 waits for it in a collective."""

import unittest

import torch
import torch.distributed as dist
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class Verdicts(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_subtest_fails_on_rank_one(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertFalse(self.rank == 1 and i == 1, "planted subtest failure")

    @unittest.expectedFailure
    @with_comms
    def test_expected_failure_while_peer_waits(self):
        if self.rank == 0:
            raise AssertionError("planted: rank 0 fails before the collective")
        t = torch.ones(1)
        dist.all_reduce(t)
