"""A pair-representation block: triangle updates (outgoing, incoming) and pair-biased row attention.

``z <- z + TriOut(z, m);  z <- z + TriIn(z, m);  z <- z + PairAttention(z, m)``

The CP version runs each sub-layer on this rank's block of the 2-D-sharded pair tensor
(see :mod:`.triangle` and :mod:`.pair_attention` for the communication each needs);
residual adds are local. State dicts of :class:`PairBlock` and :class:`CPPairBlock` match.

Example::

    serial = PairBlock(8, hidden=8, heads=2, head_dim=4)
    cp = CPPairBlock(8, hidden=8, heads=2, head_dim=4, mesh=mesh)
    cp.load_state_dict(serial.state_dict())
    pad = pair_pad(z, mesh)
    zd = pad_and_shard(z, mesh, pair_placements(z.ndim), pad_to=pad)
    md = pad_and_shard(m, mesh, pair_placements(m.ndim, channels_last=False), pad_to=pad)
    undistribute(cp(zd, md), z.shape)   # == serial(z, m)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cpmatrix.suite.distribute import from_local
from cpmatrix.suite.ops.common import check_path
from cpmatrix.suite.ops.pair_attention import CPPairAttention, PairAttention
from cpmatrix.suite.ops.triangle import CPTriangleMultiplication, TriangleMultiplication

__all__ = ["CPPairBlock", "PairBlock"]


class PairBlock(nn.Module):
    """Serial pair block. Example: ``PairBlock(8, 8, 2, 4)(z, mask)``."""

    def __init__(self, channels: int, hidden: int, heads: int, head_dim: int, *,
                 path: str = "reference") -> None:
        super().__init__()
        self.path = check_path(path)
        self.tri_out = TriangleMultiplication(channels, hidden, "outgoing", path=path)
        self.tri_in = TriangleMultiplication(channels, hidden, "incoming", path=path)
        self.attn = PairAttention(channels, heads, head_dim, path=path)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        z = z + self.tri_out(z, mask)
        z = z + self.tri_in(z, mask)
        y: torch.Tensor = z + self.attn(z, mask)
        return y


class CPPairBlock(nn.Module):
    """CP pair block on a 2-D-sharded pair tensor; same parameter names as :class:`PairBlock`."""

    def __init__(self, channels: int, hidden: int, heads: int, head_dim: int, mesh: Any, *,
                 path: str = "reference") -> None:
        super().__init__()
        self.path, self.mesh = check_path(path), mesh
        self.tri_out = CPTriangleMultiplication(channels, hidden, "outgoing", mesh, path=path)
        self.tri_in = CPTriangleMultiplication(channels, hidden, "incoming", mesh, path=path)
        self.attn = CPPairAttention(channels, heads, head_dim, mesh, path=path)

    def forward_local(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The block on this rank's ``z (..., a, b, c)`` and mask ``(..., a, b)``."""
        z = z + self.tri_out.forward_local(z, mask)
        z = z + self.tri_in.forward_local(z, mask)
        return z + self.attn.forward_local(z, mask)

    def forward(self, z: DTensor, mask: DTensor) -> DTensor:
        out = self.forward_local(z.to_local(), mask.to_local())
        return from_local(out, z.device_mesh, z.placements, z.shape)
