"""A ``MultiProcContinuousTest`` class whose ``world_size`` is a read-only property (issue
29, cause 2): the harness's worker loop sets ``world_size`` and ``rank`` on the class
before it makes the instance, so the property never needs a setter."""

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest


class PropertySized(MultiProcContinuousTest):
    @property
    def world_size(self):
        return 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_all_reduce(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), float(self.world_size))

    def test_rank_and_size(self):
        self.assertEqual(self.world_size, 2)
        self.assertEqual(dist.get_rank(), self.rank)
