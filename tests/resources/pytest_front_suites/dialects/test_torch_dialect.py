"""torch's MultiProcessTestCase family, written as PyTorch's own distributed tests are.

Natively (plain pytest) each test spawns its ranks; with --cpmatrix the ranks are a
world's. Outcomes must be the same test for test (tests/worlds/test_pytest_front.py).
"""

import os
import unittest

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase,
    skip_if_lt_x_gpu,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    DTensorTestBase,
    with_comms,
)


class PairTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        # Set before the ranks start: natively the spawned ranks inherit it.
        os.environ["PAIR_TEST_FLAG"] = "on"
        super().setUp()

    @with_comms
    def test_add_sharded(self):
        mesh = self.build_device_mesh()
        x = torch.arange(16, dtype=torch.float64).reshape(4, 4)
        dx = distribute_tensor(x, mesh, [Shard(0)])
        self.assertEqual((dx + 1).full_tensor(), x + 1)
        self.assertEqual(dx.to_local().shape, (2, 4))

    @with_comms
    @parametrize("dim", [0, 1])
    def test_redistribute(self, dim):
        mesh = self.build_device_mesh()
        x = torch.randn(4, 6)
        dx = distribute_tensor(x, mesh, [Shard(dim)]).redistribute(mesh, [Replicate()])
        self.assertEqual(dx.to_local(), x)

    @with_comms
    def test_env_from_setup(self):
        self.assertEqual(os.environ.get("PAIR_TEST_FLAG"), "on")
        # A spawned worker has no torchrun variables: tests may tell by them.
        self.assertNotIn("WORLD_SIZE", os.environ)

    @with_comms
    def test_fails_on_rank_one(self):
        t = torch.ones(2) * self.rank
        dist.all_reduce(t)
        if self.rank == 1:
            self.assertEqual(t.sum().item(), 99.0, msg="planted mismatch on rank 1")

    @skip_if_lt_x_gpu(2)
    @with_comms
    def test_needs_two_gpus(self):
        raise AssertionError("never runs on a CPU machine")

    def test_skips_itself(self):
        # Outside with_comms: natively a skip inside it races with the peers' init_pg.
        self.skipTest("not meaningful on gloo")

    @unittest.expectedFailure
    @with_comms
    def test_expected_failure(self):
        mesh = self.build_device_mesh()
        dx = distribute_tensor(torch.ones(4), mesh, [Shard(0)])
        self.assertEqual(dx.full_tensor().sum().item(), 5.0)


instantiate_parametrized_tests(PairTest)


class QuadTest(DTensorTestBase):
    # DTensorTestBase's default world: 4 ranks on a CPU machine.

    @with_comms
    def test_matmul_colwise(self):
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        a, b = torch.randn(4, 8), torch.randn(8, 8)
        db = distribute_tensor(b, mesh, [Shard(1)])
        da = distribute_tensor(a, mesh, [Replicate()])
        self.assertEqual((da @ db).full_tensor(), a @ b)


class OwnGroupTest(MultiProcessTestCase):
    """A MultiProcessTestCase that makes its own group, as many of PyTorch's do."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_allgather_own_group(self):
        dist.init_process_group("gloo", init_method=f"file://{self.file_name}",
                                world_size=self.world_size, rank=self.rank)
        out = [torch.zeros(1) for _ in range(self.world_size)]
        dist.all_gather(out, torch.tensor([float(self.rank)]))
        self.assertEqual(torch.cat(out), torch.tensor([0.0, 1.0]))
        dist.destroy_process_group()


class ContinuousTest(DTensorContinuousTestBase):
    world_size = 2

    def test_sum(self):
        mesh = self.build_device_mesh()
        dx = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        self.assertEqual(dx.sum().full_tensor().item(), 16.0)

    def test_rank_attributes(self):
        self.assertEqual(self.world_size, 2)
        self.assertIn(self.rank, (0, 1))
        self.assertEqual(dist.get_rank(), self.rank)


if __name__ == "__main__":
    from torch.testing._internal.common_utils import run_tests

    run_tests()
