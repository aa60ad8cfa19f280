import torch
from _common import check
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

BINARY = {
    "add": torch.add,
    "mul": torch.mul,
    "sub": torch.sub,
    "maximum": torch.maximum,
}
UNARY = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "neg": torch.neg,
    "abs": torch.abs,
    "sigmoid": torch.sigmoid,
}


class ElementwisePairTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    @parametrize("op", list(BINARY))
    @parametrize("placement", ["shard0", "shard1", "replicate"])
    def test_binary(self, op, placement):
        check(self, self.build_device_mesh(), BINARY[op], (4, 6), (4, 6), placement=placement)

    @with_comms
    @parametrize("fn", list(UNARY))
    @parametrize("placement", ["shard0", "shard1", "replicate"])
    def test_unary(self, fn, placement):
        check(self, self.build_device_mesh(), UNARY[fn], (6, 4), placement=placement)


class ElementwiseQuadTest(DTensorTestBase):
    @with_comms
    @parametrize("op", list(BINARY))
    @parametrize("placement", ["shard0", "replicate"])
    def test_binary(self, op, placement):
        check(self, self.build_device_mesh(), BINARY[op], (8, 4), (8, 4), placement=placement)


instantiate_parametrized_tests(ElementwisePairTest)
instantiate_parametrized_tests(ElementwiseQuadTest)
