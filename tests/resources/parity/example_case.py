"""my_cases.py - a row-parallel linear layer checked against nn.Linear."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants


class _SumGradOverShards(torch.autograd.Function):
    """Identity forward. Backward sums a replicated parameter's grad over the ranks that
    hold different rows: each rank only saw its own rows."""

    @staticmethod
    def forward(ctx, param, groups, skip):
        ctx.groups, ctx.skip = groups, skip
        return param.view_as(param)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        if not ctx.skip:  # the planted bug "no_allreduce" skips this
            for group in ctx.groups:
                dist.all_reduce(grad, group=group)
        return grad, None, None


class RowParallelLinear(nn.Linear):
    """nn.Linear on rows sharded over the mesh. Same parameter names as nn.Linear, so one
    state_dict loads into both; the parameters are plain tensors, replicated."""

    def __init__(self, d_in, d_out, cell):
        super().__init__(d_in, d_out)
        self.cell = cell

    def forward(self, input: DTensor) -> DTensor:
        mesh = input.device_mesh
        groups = [mesh.get_group(d) for d in range(mesh.ndim) if mesh.size(d) > 1]
        skip = mutant_on(self.cell, "no_allreduce")
        weight = _SumGradOverShards.apply(self.weight, groups, skip)
        bias = _SumGradOverShards.apply(self.bias, groups, skip)
        out = F.linear(input.to_local(), weight, bias)
        shape = torch.Size((*input.shape[:-1], self.out_features))
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(out, mesh, input.placements, shape=shape, stride=stride)


@mutants(no_allreduce="the weight and bias grads are not summed over the row shards")
def row_parallel_linear(cell):
    torch.manual_seed(cell.seed)  # same initial weights on every rank
    check_parity(
        cell,
        serial=nn.Linear(16, 8),
        cp=RowParallelLinear(16, 8, cell),
        inputs={"input": TensorSpec(shape=(cell.params.get("rows", 10), 16))},
        placements={"input": [Shard(0), Shard(0)]},  # rows over cp0 x cp1
    )
