"""Recipe: sequence parallel (Megatron-SP) around a tensor parallel MLP, on ``cp1``.

A pre-norm residual block ``x + down(gelu(up(norm(x))))`` with the sequence dim of ``x``
sharded over ``cp1``: ``SequenceParallel`` runs the LayerNorm on each rank's tokens (its
weight and bias replicated DTensors whose grads DTensor reduces over the sequence shards),
``ColwiseParallel(input_layouts=Shard(1))`` all-gathers the sequence into the column-parallel
up projection, ``RowwiseParallel(output_layouts=Shard(1))`` reduce-scatters the row-parallel
output back to sequence shards. The input is a DTensor on ``cell.mesh["cp1"]``
(``placements={"x": {"cp1": Shard(1)}}``), and so is the output.

Planted bug (``cpmatrix run --mutants``):

- ``norm_grad_not_reduced``: the norm is left out of the plan and run on the local tokens
  (``PrepareModuleInput(..., use_local_output=True)``): its forward is still right (a norm
  is per token), but its weight and bias grads are each rank's partial sums, never reduced
  over the sequence shards: killed by ``param_grad`` (they differ from serial and across
  ``cp1``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = ["Block", "sequence_parallel_block", "sp_plan"]


class Block(nn.Module):
    """``x + down(gelu(up(norm(x))))`` on ``(batch, seq, dim)``."""

    def __init__(self, dim: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.down(nn.functional.gelu(self.up(self.norm(x))))
        return x + h


def sp_plan(cell: Any) -> dict[str, Any]:
    """Sequence parallel on the norm, tensor parallel on the MLP, sequence dim 1."""
    plan: dict[str, Any] = {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    if mutant_on(cell, "norm_grad_not_reduced"):
        plan["norm"] = PrepareModuleInput(
            input_layouts=Shard(1), desired_input_layouts=Shard(1), use_local_output=True)
    return plan


@mutants(norm_grad_not_reduced="the norm runs on the local tokens, its grads never reduced")
def sequence_parallel_block(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    seq = 3 * cell.mesh.size(1)  # a multiple of the cp1 axis: even sequence shards
    check_parity(
        cell, Block(), Block(),
        inputs={"x": TensorSpec(shape=(2, seq, 8))},
        placements={"x": {"cp1": Shard(1)}},  # a DTensor on cell.mesh["cp1"]
        prepare_cp=lambda module, mesh: parallelize_module(module, mesh["cp1"], sp_plan(cell)),
    )
