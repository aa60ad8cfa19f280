"""``pytest.exit()`` inside a spawned rank's test method (issue 29): natively torch's
worker catches it as any exception and exits with its error code, so the test fails and
the session goes on; the next test of the class runs on its own and passes."""

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class ExitInBody(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_a_exits_in_its_body(self):
        pytest.exit("planted pytest.exit in a spawned rank", returncode=3)

    @with_comms
    def test_b_runs_after_it(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)
