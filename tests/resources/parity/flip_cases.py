"""Cases where rounding is not smooth: a discrete decision flips under rounding.

- :func:`relu_mlp`: an MLP with ReLU whose first layer is row-parallel over ``cp1`` (the
  input features split, partial sums all-reduced): its pre-activations round differently
  from serial, so one near 0 can take the other sign and its grads move by O(1).
- :func:`moe_topk`: a mixture of experts with top-k routing whose router is row-parallel
  the same way: a near tie between two experts' logits can route a token elsewhere.

Rows (tokens) are sharded over ``cp0`` (data parallel). ``params.d_out`` sets the size of
the last bias (1, 3, 8: the tiny tensors a 10% bug must not hide in). Both are correct
unless a declared mutant is on; ``bias_grad_10pct`` scales the last bias's grad by 0.9.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

_BUG = "bias_grad_10pct"
_BUG_TEXT = "the last bias's grad is 0.9 x the right one (a 10% bug on a tiny tensor)"
_EARLY = "count_reduced_early"
_EARLY_TEXT = "the CP side already sums tokens_per_expert over cp0, and the loop sums it again"
_HIDDEN = "hidden_bias_grad_half"
_HIDDEN_TEXT = "the hidden layer's bias grad (where the ReLU flips land) is 0.5 x the right one"


class _ReduceGrad(torch.autograd.Function):
    """Identity forward; the grad summed over ``groups`` in backward (and scaled by
    ``scale``: the planted bug)."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, groups: list[Any], scale: float) -> torch.Tensor:
        ctx.groups, ctx.scale = groups, scale
        return p.view_as(p)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        g = g.clone()
        for group in ctx.groups:
            dist.all_reduce(g, group=group)
        return g * ctx.scale if ctx.scale != 1.0 else g, None, None


class _SumOver(torch.autograd.Function):
    """Partial sums all-reduced over ``group`` (forward); backward the identity: every
    rank's partial gets the full grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.clone()
        if group is not None:
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return g, None


class _GatherCols(torch.autograd.Function):
    """All-gather of the last dim over ``group``; backward keeps this rank's slice (the
    computation after it is replicated over ``group``: every rank has the same grad)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, index: int, size: int) -> torch.Tensor:
        ctx.index, ctx.width = index, x.shape[-1]
        if group is None:
            return x.clone()
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, -1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        lo = ctx.index * ctx.width
        return g[..., lo : lo + ctx.width].contiguous(), None, None, None


def _axes(x: DTensor) -> tuple[list[Any], Any, int, int]:
    """(row groups over cp0, the cp1 group or None, this rank's cp1 index, cp1 size)."""
    mesh = x.device_mesh
    rows = [mesh.get_group(0)] if mesh.size(0) > 1 else []
    cols = mesh.get_group(1) if mesh.size(1) > 1 else None
    return rows, cols, mesh.get_local_rank(1), mesh.size(1)


class MLP(nn.Module):
    """``serial_flip``: in a low precision, the pre-activation nearest 0 takes the other
    sign (what the serial side's own rounding does to a near tie; the fp64 twin and its
    probes run in float64, where it does not): issue 31's flip on the serial side."""

    def __init__(self, d_in: int, hidden: int, d_out: int, serial_flip: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)
        self.serial_flip = serial_flip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.serial_flip and h.dtype != torch.float64:
            nearest = torch.zeros_like(h).flatten()
            nearest[h.detach().abs().argmin()] = 2.0
            h = h * (1 - nearest.view_as(h))
        return self.fc2(torch.relu(h))


class CPMLP(MLP):
    """fc1 row-parallel over cp1 (each rank its slice of the input features, partial
    pre-activations all-reduced), rows over cp0; replicated parameters."""

    def __init__(self, d_in: int, hidden: int, d_out: int, cell: Any) -> None:
        super().__init__(d_in, hidden, d_out)
        self.cell = cell

    def forward(self, x: DTensor) -> DTensor:  # type: ignore[override]
        rows, cols, index, _size = _axes(x)
        everyone = rows + ([cols] if cols is not None else [])
        local = x.to_local()
        width = local.shape[-1]
        w1 = _ReduceGrad.apply(self.fc1.weight, everyone, 1.0)[
            :, index * width : (index + 1) * width
        ]
        b1 = _ReduceGrad.apply(self.fc1.bias, rows, 0.5 if mutant_on(self.cell, _HIDDEN) else 1.0)
        scale = 0.9 if mutant_on(self.cell, _BUG) else 1.0
        w2 = _ReduceGrad.apply(self.fc2.weight, rows, 1.0)
        b2 = _ReduceGrad.apply(self.fc2.bias, rows, scale)
        h = _SumOver.apply(local @ w1.T, cols) + b1
        y = F.linear(torch.relu(h), w2, b2)
        shape = torch.Size((x.shape[0], y.shape[-1]))
        return DTensor.from_local(
            y,
            x.device_mesh,
            [Shard(0), Replicate()],
            shape=shape,
            stride=torch.empty(shape, device="meta").stride(),
        )


@mutants(**{_BUG: _BUG_TEXT, _HIDDEN: _HIDDEN_TEXT})
def relu_mlp(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    d_out = int(cell.params.get("d_out", 3))
    rows = int(cell.params.get("rows", 16))
    check_parity(
        cell,
        MLP(16, 32, d_out, serial_flip=bool(cell.params.get("serial_flip", False))),
        CPMLP(16, 32, d_out, cell),
        inputs={"x": TensorSpec(shape=(rows, 16))},
        placements={"x": [Shard(0), Shard(1)]},
    )


class MoE(nn.Module):
    """Top-k routing over ``experts`` linear experts, softmax over the chosen logits."""

    def __init__(self, d: int, experts: int, k: int, d_out: int, count: bool = False) -> None:
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))
        self.head = nn.Linear(d, d_out)
        self.k = k
        self.count = count
        if count:  # tokens routed to each expert: a per-rank partial count on the CP side
            self.register_buffer("tokens_per_expert", torch.zeros(experts, dtype=torch.int64))

    def mix(self, x: torch.Tensor, logits: torch.Tensor, experts: list[Any]) -> torch.Tensor:
        top, idx = logits.topk(self.k, dim=-1)
        gate = top.softmax(-1)
        out = torch.zeros_like(x)
        for e, (w, b) in enumerate(experts):
            chosen = idx == e
            weight = (gate * chosen).sum(-1, keepdim=True)
            out = out + weight * F.linear(x, w, b)
        if self.count:
            self.tokens_per_expert += torch.bincount(idx.reshape(-1), minlength=len(experts))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = [(m.weight, m.bias) for m in self.experts]
        return self.head(self.mix(x, self.router(x), experts))


class CPMoE(MoE):
    """The router row-parallel over cp1 (partial logits all-reduced: a near tie can route
    a token elsewhere than serial), the experts on the gathered features, rows over cp0.
    ``tokens_per_expert`` counts this rank's rows only: Partial over cp0 by design."""

    def __init__(self, *args: Any, cell: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.cell = cell

    def forward(self, x: DTensor) -> DTensor:  # type: ignore[override]
        rows, cols, index, size = _axes(x)
        everyone = rows + ([cols] if cols is not None else [])
        local = x.to_local()
        width = local.shape[-1]
        wr = _ReduceGrad.apply(self.router.weight, everyone, 1.0)[
            :, index * width : (index + 1) * width
        ]
        br = _ReduceGrad.apply(self.router.bias, rows, 1.0)
        logits = _SumOver.apply(local @ wr.T, cols) + br
        full = _GatherCols.apply(local, cols, index, size)
        experts = [
            (_ReduceGrad.apply(m.weight, rows, 1.0), _ReduceGrad.apply(m.bias, rows, 1.0))
            for m in self.experts
        ]
        scale = 0.9 if mutant_on(self.cell, _BUG) else 1.0
        hw = _ReduceGrad.apply(self.head.weight, rows, 1.0)
        hb = _ReduceGrad.apply(self.head.bias, rows, scale)
        y = F.linear(self.mix(full, logits, experts), hw, hb)
        if self.count and rows and mutant_on(self.cell, _EARLY):
            dist.all_reduce(self.tokens_per_expert, group=rows[0])
        shape = torch.Size((x.shape[0], y.shape[-1]))
        return DTensor.from_local(
            y,
            x.device_mesh,
            [Shard(0), Replicate()],
            shape=shape,
            stride=torch.empty(shape, device="meta").stride(),
        )


@mutants(**{_EARLY: _EARLY_TEXT})
def moe_counts(cell: Any) -> None:
    """The MoE pattern of a buffer partial by design: each rank counts the tokens it routed
    (``tokens_per_expert``), the training loop sums the counts over the data-parallel axis
    (cp0) later. ``params.declare``: whether the case declares it ``Partial`` over cp0."""
    torch.manual_seed(cell.seed)
    declare = bool(cell.params.get("declare", True))
    check_parity(
        cell,
        MoE(8, 4, 2, 3, count=True),
        CPMoE(8, 4, 2, 3, count=True, cell=cell),
        inputs={"x": TensorSpec(shape=(32, 8))},
        placements={"x": [Shard(0), Shard(1)]},
        allow_zero={
            f"grad experts.{e}.{p}": "an expert no token is routed to has no grad"
            for e in range(4)
            for p in ("weight", "bias")
        },
        buffers={"tokens_per_expert": {"cp0": Partial()}} if declare else None,
    )


@mutants(**{_BUG: _BUG_TEXT})
def moe_topk(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    d_out = int(cell.params.get("d_out", 3))
    rows = int(cell.params.get("rows", 32))
    idle = {
        f"grad experts.{e}.{p}": "an expert no token is routed to has no grad"
        for e in range(4)
        for p in ("weight", "bias")
    }
    check_parity(
        cell,
        MoE(8, 4, 2, d_out),
        CPMoE(8, 4, 2, d_out, cell=cell),
        inputs={"x": TensorSpec(shape=(rows, 8))},
        placements={"x": [Shard(0), Shard(1)]},
        allow_zero=idle,
    )
