"""Classes of torch's harness that run in ONE process next to one that spawns its ranks
(issue 29, cause 1): a class made by ``create_local_tensor_test_class`` (LocalTensor mode,
a ``fake`` group of 2 in the pytest process), a ``MultiThreadedTestCase`` (threads), a
class whose own ``setUp`` never spawns, and a plain ``TestCase``. Only ``Spawned`` is
multi-rank; the others must run in the pytest process as they do natively.
"""

import unittest

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.common_distributed import MultiThreadedTestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    with_comms,
)


class Spawned(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_sum_sharded(self):
        mesh = self.build_device_mesh()
        dx = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
        self.assertEqual(dx.sum().full_tensor().item(), 8.0)

    @with_comms
    def test_skipped_in_local_mode(self):
        if self.is_local_tensor_enabled:
            self.skipTest("planted: not in LocalTensor mode")
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


# The same tests in LocalTensor mode, run in this process.
SpawnedWithLocalTensor = create_local_tensor_test_class(Spawned)


class Threads(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_all_reduce_in_threads(self):
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 3.0)


class Plain(unittest.TestCase):
    def test_in_this_process(self):
        self.assertFalse(dist.is_initialized())
