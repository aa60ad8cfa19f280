"""Recipe: FSDP2 over ``cp0`` with tensor parallel over ``cp1`` (the standard 2-D layout).

The batch is split over ``cp0`` (data parallel: ``placements={"x": {"cp0": Shard(0)}}``, a
DTensor on ``cell.mesh["cp0"]``); each ``cp0`` row runs the tensor parallel MLP of
:mod:`.tensor_parallel` over ``cp1`` on its rows of the batch, and ``fully_shard`` over
``cp0`` shards every parameter over the rows too (FSDP2 composes with TP into 2-D DTensor
parameters: ``(_StridedShard, Shard)``). The module hands its local batch to the inner MLP
and wraps the result back as a DTensor sharded over ``cp0``.

``check_parity``'s loss is a *sum* over the whole batch, so the data-parallel gradient is
the sum of the rows' gradients: ``set_gradient_divide_factor(1.0)``. FSDP's default divides
by the ``cp0`` size, which assumes each row's loss is a mean (a real training loop's
choice; the check would then see half the serial gradient, and say so in ``param_grad``).

Planted bug (``cpmatrix run --mutants``):

- ``fsdp_skips_param``: ``up.bias`` is left out of FSDP (``ignored_params``): it is neither
  sharded nor reduced over ``cp0``, so each row keeps the gradient of its own half of the
  batch: killed by ``param_grad`` (it differs from serial and across ``cp0``).

FSDP2 runs on CPU with gloo in torch 2.13 (2x1, 2x2 here), with one workaround: gloo has
no ``PREMUL_SUM``, so the collectives are forced to plain sums (see :func:`parallelize`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = ["MLP", "DataParallelMLP", "fsdp_tp_mlp", "parallelize"]


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
    """The same MLP (same parameter names) on a batch sharded over the data-parallel axis:
    this rank's rows through the (tensor parallel) layers, back as a DTensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert isinstance(x, DTensor), "the data-parallel input is a DTensor over cp0"
        y = super().forward(x.to_local())
        shape = torch.Size((*x.shape[:-1], y.shape[-1]))
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(y, x.device_mesh, x.placements, shape=shape, stride=stride)


def parallelize(cell: Any, module: nn.Module, mesh: Any) -> nn.Module:
    """TP over cp1, then FSDP2 over cp0; gradients summed over the batch rows."""
    plan = {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}
    parallelize_module(module, mesh["cp1"], plan)
    ignored = {module.get_parameter("up.bias")} if mutant_on(cell, "fsdp_skips_param") else None
    fsdp = fully_shard(module, mesh=mesh["cp0"], ignored_params=ignored)
    fsdp.set_gradient_divide_factor(1.0)  # the check's loss sums over the whole batch
    # gloo has no ReduceOp.PREMUL_SUM, which FSDP2 uses for a custom divide factor on fp32
    # ("Cannot use ReduceOp.PREMUL_SUM with Gloo"): plain SUM collectives instead
    # (https://github.com/pytorch/pytorch/pull/155915). On nccl this only costs a scale.
    fsdp.set_force_sum_reduction_for_comms(True)
    return module


@mutants(fsdp_skips_param="up.bias is left out of FSDP: not sharded, not reduced over cp0")
def fsdp_tp_mlp(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    check_parity(
        cell, MLP(), DataParallelMLP(),
        inputs={"x": TensorSpec(shape=(2 * cell.mesh.size(0), 8))},
        placements={"x": {"cp0": Shard(0)}},  # the batch over the data-parallel axis
        prepare_cp=lambda module, mesh: parallelize(cell, module, mesh),
    )
