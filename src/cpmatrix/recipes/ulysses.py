"""Recipe: Ulysses sequence parallel attention (all-to-all between sequence and heads).

Multi-head self-attention on ``(batch, seq, dim)`` with the sequence sharded over ``cp1``
(DeepSpeed-Ulysses). The q/k/v/out projections are replicated (``distribute_module`` on
``cell.mesh["cp1"]``) and applied to the local tokens; an ``all_to_all_single`` then trades
the sequence shards for head shards (each rank gets the *whole* sequence for ``heads / P``
heads), attention runs locally per head, and a second all-to-all trades back. The heads
must divide by the ``cp1`` size. The heads-sharded activation is declared to
``check_parity`` (``activations=``), so the evidence shows it split over ``cp1``.

Planted bug (``cpmatrix run --mutants``):

- ``a2a_wrong_split_dim``: the all-to-all splits the head *width* instead of the heads
  (both ways, so every shape still fits): each rank attends with a slice of every head's
  channels, so the scores are wrong: killed by ``output``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_module

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = ["Attention", "UlyssesAttention", "seq_to_heads", "ulysses_attention"]


class Attention(nn.Module):
    """Serial multi-head self-attention: the twin."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """``(b, s, dim) -> (b, s, heads, dim / heads)``."""
        return t.reshape(*t.shape[:-1], self.heads, -1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention over ``(b, s, h, d)``: per head, over the whole sequence."""
        o = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split(f(x)) for f in (self.q, self.k, self.v))
        out: torch.Tensor = self.out(self.attend(q, k, v).flatten(-2))
        return out


class _AllToAll(torch.autograd.Function):
    """Scatter ``split`` dim, gather ``cat`` dim over a group; backward: the reverse."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, split: int, cat: int) -> torch.Tensor:
        ctx.group, ctx.split, ctx.cat = group, split, cat
        return _all_to_all(x, group, split, cat)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _all_to_all(grad, ctx.group, ctx.cat, ctx.split), None, None, None


def _all_to_all(x: torch.Tensor, group: Any, split: int, cat: int) -> torch.Tensor:
    size = dist.get_world_size(group)
    chunks = torch.stack(x.chunk(size, dim=split))  # chunk j goes to rank j
    received = torch.empty_like(chunks)
    dist.all_to_all_single(received, chunks.contiguous(), group=group)
    return torch.cat(received.unbind(0), dim=cat)  # rank i's chunk in i-th place


def seq_to_heads(x: torch.Tensor, group: Any, wrong_dim: bool = False) -> torch.Tensor:
    """``(b, s/P, h, d) -> (b, s, h/P, d)``. ``wrong_dim``: the planted bug (split d)."""
    out: torch.Tensor = _AllToAll.apply(  # type: ignore[no-untyped-call]
        x, group, 3 if wrong_dim else 2, 1)
    return out


def heads_to_seq(x: torch.Tensor, group: Any, wrong_dim: bool = False) -> torch.Tensor:
    """``(b, s, h/P, d) -> (b, s/P, h, d)``: the inverse of :func:`seq_to_heads`."""
    out: torch.Tensor = _AllToAll.apply(  # type: ignore[no-untyped-call]
        x, group, 1, 3 if wrong_dim else 2)
    return out


class UlyssesAttention(Attention):
    """The same attention (same parameter names) on a sequence sharded over ``cp1``."""

    def __init__(self, cell: Any, dim: int = 16, heads: int = 4) -> None:
        super().__init__(dim, heads)
        self.cell = cell
        self.seen: dict[str, DTensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert isinstance(x, DTensor), "the input is a DTensor sharded on the sequence"
        mesh = x.device_mesh
        group, bug = mesh.get_group(), mutant_on(self.cell, "a2a_wrong_split_dim")
        # projections on the local tokens (replicated weights), then tokens -> heads
        q, k, v = (seq_to_heads(self.split(f(x).to_local()), group, bug)
                   for f in (self.q, self.k, self.v))
        self.seen["heads q"] = DTensor.from_local(q.detach(), mesh, [Shard(2)])
        o = heads_to_seq(self.attend(q, k, v), group, bug).flatten(-2)
        out: torch.Tensor = self.out(DTensor.from_local(o, mesh, x.placements))
        return out


@mutants(a2a_wrong_split_dim="the all-to-all splits the head width instead of the heads")
def ulysses_attention(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    cp = UlyssesAttention(cell)
    check_parity(
        cell, Attention(), cp,
        inputs={"x": TensorSpec(shape=(2, 2 * cell.mesh.size(1), 16))},
        placements={"x": {"cp1": Shard(1)}},  # the sequence over cp1
        prepare_cp=lambda module, mesh: distribute_module(module, mesh["cp1"]),
        activations=lambda: cp.seen,
    )
