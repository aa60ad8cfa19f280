"""Issue 12's reports, verbatim: tensor parallel on a sub-mesh, FSDP2 over cp0 + TP over cp1.

Both are correct, standard PyTorch parallelizations; the toolkit must pass them, not crash
on them (``tests/test_parity_submesh.py``; their planted bugs live in the recipes,
``cpmatrix.recipes``):

- ``tp_mlp_cp1``: an MLP with ``parallelize_module(m, cell.mesh["cp1"], {"up":
  ColwiseParallel(), "down": RowwiseParallel()})`` in ``prepare_cp``. Reported: every cell
  failed with ``IndexError: tuple index out of range`` (1-D placements of the parameters'
  DTensors indexed against the cell's 2-D mesh).
- ``fsdp_tp``: the same TP on ``cp1``, then ``fully_shard(m, mesh=cell.mesh["cp0"])``, with a
  replicated input. Reported: ``VacuousError: sharding_active`` (only sharded inputs counted
  as evidence of an active parallel path; the sharded parameters did not).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from cpmatrix.parity import TensorSpec, check_parity


class MLP(nn.Module):
    def __init__(self, d: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _tp(cell: Any, module: nn.Module) -> nn.Module:
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    return parallelize_module(module, cell.mesh["cp1"], plan)


def tp_mlp_cp1(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    check_parity(cell, MLP(), MLP(), inputs={"x": TensorSpec(shape=(5, 8))},
                 placements={"x": None}, prepare_cp=lambda m, mesh: _tp(cell, m))


def _fsdp_tp(cell: Any, module: nn.Module) -> nn.Module:
    fully_shard(_tp(cell, module), mesh=cell.mesh["cp0"])
    return module


def fsdp_tp(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    check_parity(cell, MLP(), MLP(), inputs={"x": TensorSpec(shape=(5, 8))},
                 placements={"x": None}, prepare_cp=lambda m, mesh: _fsdp_tp(cell, m))


def foreign_mesh(cell: Any) -> None:
    """A DTensor on a mesh over the cell's ranks that is not derived from the cell's mesh
    (its second dim runs diagonally across both cell axes): it must fail ``setup`` with the
    reason on every rank, never as an internal error."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    other = DeviceMesh(cell.device.type, torch.tensor([[0, 3], [2, 1]]), mesh_dim_names=("a", "b"))
    odd = distribute_tensor(torch.zeros(4, 4, dtype=cell.dtype), other, [Shard(0), Shard(1)],
                            src_data_rank=None)
    check_parity(cell, nn.Linear(4, 4), nn.Linear(4, 4),
                 inputs={"input": TensorSpec(shape=(4, 4))},
                 placements={"input": None}, activations=lambda: {"odd": odd})
