"""Recipe: data parallel with replicated parameters and a gradient all-reduce (DDP style).

Every rank holds the whole model (plain, replicated parameters) and a slice of the batch,
split over the flattened mesh (``[Shard(0), Shard(0)]``: rank ``(r, c)`` holds block
``r * C + c``). After backward each parameter's gradient is summed over every mesh axis
(``register_post_accumulate_grad_hook`` + ``all_reduce``), as DDP does with its buckets;
a sum, because ``check_parity``'s loss sums over the whole batch (DDP's average assumes a
per-rank mean loss).

Planted bug (``cpmatrix run --mutants``):

- ``grad_allreduce_skips_axis``: the gradient all-reduce skips one mesh axis (the last one
  of size > 1: the bug of a hand-written 2-D reduction): the grads differ from serial and
  across that axis: killed by ``param_grad``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = ["MLP", "ReplicatedMLP", "ddp_mlp", "reduce_grads"]


class MLP(nn.Module):
    """``down(gelu(up(x)))``: the serial twin."""

    def __init__(self, dim: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(nn.functional.gelu(self.up(x)))
        return out


class ReplicatedMLP(MLP):
    """The same MLP (same parameter names) on this rank's slice of the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert isinstance(x, DTensor), "the batch is a DTensor sharded over the mesh"
        y = super().forward(x.to_local())
        shape = torch.Size((*x.shape[:-1], y.shape[-1]))
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(y, x.device_mesh, x.placements, shape=shape, stride=stride)


def reduce_grads(cell: Any, module: nn.Module, mesh: Any) -> nn.Module:
    """Sum every parameter's gradient over each mesh axis > 1 once it is accumulated."""
    groups = [mesh.get_group(d) for d in range(mesh.ndim) if mesh.size(d) > 1]
    if mutant_on(cell, "grad_allreduce_skips_axis"):
        groups = groups[:-1]

    def all_reduce(param: torch.Tensor) -> None:
        assert param.grad is not None
        for group in groups:
            dist.all_reduce(param.grad, group=group)

    for param in module.parameters():
        param.register_post_accumulate_grad_hook(all_reduce)  # type: ignore[no-untyped-call]
    return module


@mutants(grad_allreduce_skips_axis="the gradient all-reduce skips one mesh axis")
def ddp_mlp(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    check_parity(
        cell, MLP(), ReplicatedMLP(),
        inputs={"x": TensorSpec(shape=(2 * cell.world_size, 8))},
        placements={"x": [Shard(0), Shard(0)]},  # the batch over the flattened mesh
        prepare_cp=lambda module, mesh: reduce_grads(cell, module, mesh),
    )
