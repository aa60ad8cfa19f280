import torch
from _common import check
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

REDUCE = {
    "sum": lambda x, dim: x.sum() if dim is None else x.sum(dim),
    "mean": lambda x, dim: x.mean() if dim is None else x.mean(dim),
    "amax": lambda x, dim: x.amax() if dim is None else x.amax(dim),
}


class ReducePairTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    @parametrize("op", list(REDUCE))
    @parametrize("dim", [0, 1, None])
    @parametrize("placement", ["shard0", "shard1"])
    def test_reduce(self, op, dim, placement):
        check(self, self.build_device_mesh(), lambda x: REDUCE[op](x, dim), (4, 6),
              placement=placement)


class ReduceQuadTest(DTensorTestBase):
    @with_comms
    @parametrize("op", ["sum", "amax"])
    @parametrize("dim", [0, 1, None])
    def test_reduce(self, op, dim):
        check(self, self.build_device_mesh(), lambda x: REDUCE[op](x, dim), (8, 4))

    @with_comms
    def test_sum_keeps_dtype(self):
        check(self, self.build_device_mesh(), lambda x: x.to(torch.float64).sum(0), (8, 4))


instantiate_parametrized_tests(ReducePairTest)
instantiate_parametrized_tests(ReduceQuadTest)
