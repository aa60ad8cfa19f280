"""Recipe: data parallel with torch's composable ``replicate()`` and a sum comm hook.

``torch.distributed._composable.replicate`` is DDP as a composable API (the one
torchtitan's ``apply_ddp`` uses): every rank holds the whole model, the batch is split over
``cp0`` (``placements={"x": {"cp0": Shard(0)}}``), and DDP all-reduces the gradients in
buckets during backward. DDP's default *averages* them (it assumes each rank's loss is a
mean over its rows); ``check_parity``'s loss sums over the whole batch, so the gradients
must be *summed*: a comm hook (:func:`sum_hook`) all-reduces each bucket without the
division. In a training loop that feeds DDP a per-rank mean, keep the default: the
convention of the loss and the reduction must agree, which is what this recipe checks.

Planted bug (``cpmatrix run --mutants``):

- ``mean_instead_of_sum``: the comm hook is left out, so DDP's default divides the summed
  gradients by the ``cp0`` size: every parameter grad is half the serial one on 2x1 and
  2x2: killed by ``param_grad``, with the hint "CP = 0.5 x serial everywhere: mean vs sum
  over `cp0`?" on 2x1 (the bug torchtitan's ``apply_ddp`` had, the other way round:
  averaging a loss that was already divided).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed.tensor import DTensor, Shard

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = ["MLP", "DataParallelMLP", "replicate_mlp", "sum_hook"]


class MLP(nn.Module):
    """``down(gelu(up(x)))``: the serial twin."""

    def __init__(self, dim: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(nn.functional.gelu(self.up(x)))
        return out


class DataParallelMLP(MLP):
    """The same MLP (same parameter names) on this rank's rows, back as a DTensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert isinstance(x, DTensor), "the batch is a DTensor sharded over cp0"
        y = super().forward(x.to_local())
        shape = torch.Size((*x.shape[:-1], y.shape[-1]))
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(y, x.device_mesh, x.placements, shape=shape, stride=stride)


# Unannotated on purpose: DDP checks a hook's annotations against the real classes, and
# under ``from __future__ import annotations`` they are strings ("should be dist.GradBucket").
def sum_hook(group, bucket):  # type: ignore[no-untyped-def]
    """A DDP comm hook that sums a gradient bucket (a ``dist.GradBucket``) over ``group``,
    without DDP's division by the group size."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    assert work is not None
    summed: torch.futures.Future[torch.Tensor] = work.get_future().then(
        lambda fut: fut.value()[0])
    return summed


def parallelize(cell: Any, module: nn.Module, mesh: Any) -> nn.Module:
    """``replicate`` over ``cp0`` with the sum hook (left out by the planted bug)."""
    dp = mesh["cp0"]
    replicate(module, device_mesh=dp)
    if not mutant_on(cell, "mean_instead_of_sum"):
        module.register_comm_hook(dp.get_group(), sum_hook)  # type: ignore[operator]
    return module


@mutants(mean_instead_of_sum="no sum comm hook: DDP averages the gradients over cp0")
def replicate_mlp(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    check_parity(
        cell, MLP(), DataParallelMLP(),
        inputs={"x": TensorSpec(shape=(2 * cell.mesh.size(0), 8))},
        placements={"x": {"cp0": Shard(0)}},  # the batch over the data-parallel axis
        prepare_cp=lambda module, mesh: parallelize(cell, module, mesh),
    )
