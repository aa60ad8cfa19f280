import torch
from _common import PLACEMENTS
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

NAMES = ["shard0", "shard1", "replicate"]


def roundtrip(case, mesh, src, dst, shape):
    torch.manual_seed(3)
    x = torch.randn(*shape)
    dx = distribute_tensor(x, mesh, src).redistribute(mesh, dst)
    case.assertEqual(dx.full_tensor(), x)
    case.assertEqual(tuple(dx.placements), tuple(dst))


class RedistributePairTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    @parametrize("src", NAMES)
    @parametrize("dst", NAMES)
    def test_redistribute(self, src, dst):
        roundtrip(self, self.build_device_mesh(), [PLACEMENTS[src]], [PLACEMENTS[dst]], (4, 6))


class RedistributeQuadTest(DTensorTestBase):
    @with_comms
    @parametrize("src", NAMES)
    @parametrize("dst", NAMES)
    def test_redistribute(self, src, dst):
        roundtrip(self, self.build_device_mesh(), [PLACEMENTS[src]], [PLACEMENTS[dst]], (8, 4))

    @with_comms
    @parametrize("layout", [((0, 1), (1, 0)), ((0, None), (None, 1)),
                            ((None, None), (0, 1)), ((1, 1), (None, 0))])
    def test_two_dim_mesh(self, layout):
        mesh = init_device_mesh(self.device_type, (2, 2), mesh_dim_names=("dp", "tp"))

        def places(dims):
            return [Replicate() if d is None else Shard(d) for d in dims]

        src, dst = layout
        roundtrip(self, mesh, places(src), places(dst), (8, 8))


instantiate_parametrized_tests(RedistributePairTest)
instantiate_parametrized_tests(RedistributeQuadTest)
