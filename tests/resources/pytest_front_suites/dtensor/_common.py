"""Shared by the DTensor suite: placements by name and a checked distributed op.

The suite is written as PyTorch's own DTensor tests are (DTensorTestBase, @with_comms,
instantiate_parametrized_tests): the benchmark (benchmarks/pytest_front.py) runs it
natively and with --cpmatrix and compares every test's outcome.
"""

import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

PLACEMENTS = {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}


def check(case, mesh, fn, *shapes, placement="shard0"):
    """fn on DTensors (each input laid out by ``placement``) equals fn on the tensors."""
    torch.manual_seed(7)
    inputs = [torch.randn(*s) for s in shapes]
    dinputs = [distribute_tensor(x, mesh, [PLACEMENTS[placement]]) for x in inputs]
    out = fn(*dinputs)
    case.assertEqual(out.full_tensor(), fn(*inputs))
