"""Recipe: tensor parallel MLP (Megatron style) on the ``cp1`` axis, against ``nn`` serial.

The up projection is column-parallel (``ColwiseParallel``: each rank holds a slice of the
hidden units), the down projection row-parallel (``RowwiseParallel``: each rank multiplies
its slice and the partial sums are all-reduced), with torch's own
``parallelize_module`` on the sub-mesh ``cell.mesh["cp1"]``. The input is a plain tensor,
identical on every rank; on a 2x2 mesh the cp0 axis holds replicas. Nothing of the input is
sharded: ``sharding_active`` is shown by the sharded parameters.

Planted bugs (``cpmatrix run --mutants``):

- ``both_colwise``: the down projection is column-parallel too (a wrong plan): every rank
  returns only its slice of the output columns (killed by ``output``);
- ``row_output_not_reduced``: the row-parallel output keeps its partial sums (no all-reduce;
  ``RowwiseParallel(output_layouts=Partial())``): killed by ``output``, and the ranks'
  outputs disagree (``replicated_identical``).

Copy it as a starting point: a target ``case: "my_recipes:tensor_parallel_mlp"`` with
``mesh: [1x2, 1x3, 2x2]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Partial
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = ["MLP", "tensor_parallel_mlp", "tp_plan"]


class MLP(nn.Module):
    """``down(gelu(up(x)))``: the serial twin, and the module parallelized."""

    def __init__(self, dim: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(nn.functional.gelu(self.up(x)))
        return out


def tp_plan(cell: Any) -> dict[str, Any]:
    """The plan: up column-wise, down row-wise. The hidden activation stays a DTensor
    (``use_local_output=False``), so the plan's layouts are what connects the two layers."""
    plan = {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}
    if mutant_on(cell, "both_colwise"):
        plan["down"] = ColwiseParallel()
    if mutant_on(cell, "row_output_not_reduced"):
        plan["down"] = RowwiseParallel(output_layouts=Partial())
    return plan


@mutants(
    both_colwise="the down projection is column-parallel too (a wrong plan)",
    row_output_not_reduced="the row-parallel output keeps its partial sums (no all-reduce)",
)
def tensor_parallel_mlp(cell: Any) -> None:
    torch.manual_seed(cell.seed)  # the same initial weights on every rank
    check_parity(
        cell, MLP(), MLP(),
        inputs={"x": TensorSpec(shape=(5, 8))},
        placements={"x": None},  # a plain tensor: ColwiseParallel takes it as replicated
        prepare_cp=lambda module, mesh: parallelize_module(module, mesh["cp1"], tp_plan(cell)),
    )
