import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

LAYOUTS = {
    "colwise": (Replicate(), Shard(1)),
    "rowwise": (Shard(1), Shard(0)),
    "batch": (Shard(0), Replicate()),
    "replicated": (Replicate(), Replicate()),
}


def matmul(case, mesh, layout, m, k, n):
    torch.manual_seed(11)
    a, b = torch.randn(m, k), torch.randn(k, n)
    pa, pb = LAYOUTS[layout]
    out = distribute_tensor(a, mesh, [pa]) @ distribute_tensor(b, mesh, [pb])
    case.assertEqual(out.full_tensor(), a @ b)


class MatmulPairTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    @parametrize("layout", list(LAYOUTS))
    def test_mm(self, layout):
        matmul(self, self.build_device_mesh(), layout, 4, 6, 8)


class MatmulQuadTest(DTensorTestBase):
    @with_comms
    @parametrize("layout", list(LAYOUTS))
    def test_mm(self, layout):
        matmul(self, self.build_device_mesh(), layout, 8, 8, 4)


instantiate_parametrized_tests(MatmulPairTest)
instantiate_parametrized_tests(MatmulQuadTest)
