"""Shapes whose native outcome cpmatrix must keep (issue 29, cause 6): a continuous class
pinned to nccl on a host without it (natively skipped), a continuous class sized by the
GPU count on a CPU host (natively skipped, the session goes on), and a spawning class
whose ranks rendezvous through ``FileStore(self.file_name)`` (natively one file for all
the ranks of a test)."""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import (
    MultiProcContinuousTest,
    MultiProcessTestCase,
)


class PinnedToNccl(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "nccl"

    def test_nccl_all_reduce(self):
        t = torch.ones(1)
        dist.all_reduce(t)


class SizedByGpus(MultiProcContinuousTest):
    @classmethod
    def device_type(cls):
        return "cuda"

    def test_on_every_gpu(self):
        self.assertGreater(self.world_size, 0)


class SharedFileStore(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_rendezvous_through_the_file(self):
        store = dist.FileStore(self.file_name, self.world_size)
        store.set_timeout(timedelta(seconds=20))
        store.set(f"rank{self.rank}", str(self.rank))
        other = 1 - self.rank
        self.assertEqual(store.get(f"rank{other}"), str(other).encode())
