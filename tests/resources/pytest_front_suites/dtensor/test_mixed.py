"""Views, expected failures, real failures and skips: the rest of a real suite's mix."""

import unittest

import torch
from _common import PLACEMENTS, check
from torch.distributed.tensor import distribute_tensor
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

VIEWS = {
    "transpose": lambda x: x.transpose(0, 1),
    "flatten": lambda x: x.reshape(-1),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "clone": lambda x: x.clone(),
}


class ViewPairTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    @parametrize("view", list(VIEWS))
    @parametrize("placement", ["shard0", "replicate"])
    def test_view(self, view, placement):
        check(self, self.build_device_mesh(), VIEWS[view], (4, 6), placement=placement)

    @unittest.expectedFailure
    @with_comms
    @parametrize("placement", ["shard0", "replicate"])
    def test_known_wrong_expectation(self, placement):
        # Written wrong on purpose: sixteen ones never sum to seventeen.
        dx = distribute_tensor(torch.ones(4, 4), self.build_device_mesh(),
                               [PLACEMENTS[placement]])
        self.assertEqual(dx.sum().full_tensor().item(), 17.0)

    @with_comms
    def test_wrong_on_every_rank(self):
        # A real failure (no expectedFailure): the suite's outcomes are not passes alone.
        dx = distribute_tensor(torch.ones(4, 4), self.build_device_mesh(), [PLACEMENTS["shard0"]])
        self.assertEqual(dx.sum().full_tensor().item(), 15.0)

    @with_comms
    def test_wrong_on_rank_one(self):
        # Every collective done, then rank 1 alone finds a mismatch.
        dx = distribute_tensor(torch.ones(4, 4), self.build_device_mesh(), [PLACEMENTS["shard0"]])
        total = dx.sum().full_tensor().item()
        self.assertEqual(total, 15.0 if self.rank == 1 else 16.0)

    @skip_if_lt_x_gpu(2)
    @with_comms
    @parametrize("placement", ["shard0", "shard1"])
    def test_needs_gpus(self, placement):
        check(self, self.build_device_mesh(), torch.relu, (4, 4), placement=placement)

    @unittest.skipIf(True, "the backend lacks it here")
    @with_comms
    def test_skipped_by_condition(self):
        raise AssertionError("never runs")


class ViewQuadTest(DTensorTestBase):
    @with_comms
    @parametrize("view", ["transpose", "clone"])
    def test_view(self, view):
        check(self, self.build_device_mesh(), VIEWS[view], (8, 4))

    @unittest.expectedFailure
    @with_comms
    def test_known_wrong_expectation(self):
        check(self, self.build_device_mesh(), lambda x: x * 2, (8, 4))
        raise AssertionError("a known gap")

    @skip_if_lt_x_gpu(4)
    @with_comms
    def test_needs_four_gpus(self):
        check(self, self.build_device_mesh(), torch.relu, (8, 4))


instantiate_parametrized_tests(ViewPairTest)
instantiate_parametrized_tests(ViewQuadTest)
