"""Triangle multiplicative update (AlphaFold 2, Algorithms 11 and 12) on a pair tensor.

For a pair tensor ``z (..., N, N, c)`` and pair mask ``m (..., N, N)``::

    zn = LayerNorm(z)
    a  = sigmoid(a_gate(zn)) * a_proj(zn) * m        b likewise        (..., N, N, h)
    outgoing:  x_ij = sum_k a_ik * b_jk              (edges i->k and j->k)
    incoming:  x_ij = sum_k a_ki * b_kj              (edges k->i and k->j)
    out = sigmoid(gate(zn)) * out_proj(LayerNorm(x))  out_proj zero-initialized

CP layout (:func:`~cpmatrix.suite.distribute.pair_placements`): rank ``(r, c)`` holds
rows ``I_r`` and columns ``J_c``. ``x[I_r, J_c]`` needs ``a``'s rows ``I_r`` for every
``k`` and ``b``'s rows ``J_c`` for every ``k``:

* outgoing: ``a[I_r, :]`` is an all-gather of ``a`` along cp1; ``b[J_c, :]`` is not held
  by any mesh row, so ``b`` is transposed first (:func:`transpose_pair`) and ``b^T[:, J_c]``
  gathered along cp0;
* incoming: ``a[:, I_r] = (a^T)[I_r, :]`` (transpose, gather along cp1) and ``b[:, J_c]``
  (gather along cp0).

Either way one transpose and two all-gathers, then a local contraction over ``k``.
Padded rows/columns have ``m = 0``, so they contribute nothing to the sum over ``k``.

Mutant ``tri_mask_off`` (CP only): the mask is not applied to ``a`` and ``b``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cpmatrix.suite.distribute import from_local
from cpmatrix.suite.mutants import is_planted
from cpmatrix.suite.ops.collectives import all_gather, transpose_pair
from cpmatrix.suite.ops.common import PAIR_AXES, check_path, replicated_linear, zero_init_
from cpmatrix.suite.ops.layernorm import LayerNorm, ShardedLayerNorm

__all__ = ["CPTriangleMultiplication", "Direction", "TriangleMultiplication"]

Direction = Literal["outgoing", "incoming"]


class TriangleMultiplication(nn.Module):
    """Serial triangle multiplicative update; ``direction`` is ``outgoing`` or ``incoming``.

    Example::

        tri = TriangleMultiplication(8, hidden=8, direction="incoming")
        dz = tri(z, mask)            # z: (N, N, 8), mask: (N, N); residual is the caller's
    """

    def __init__(self, channels: int, hidden: int, direction: Direction, *,
                 path: str = "reference") -> None:
        super().__init__()
        if direction not in ("outgoing", "incoming"):
            raise ValueError(f"direction must be 'outgoing' or 'incoming', got {direction!r}")
        self.direction, self.path = direction, check_path(path)
        self.ln_in = self._norm(channels)
        self.a_proj, self.a_gate = nn.Linear(channels, hidden), nn.Linear(channels, hidden)
        self.b_proj, self.b_gate = nn.Linear(channels, hidden), nn.Linear(channels, hidden)
        self.gate = nn.Linear(channels, channels)
        self.ln_out = self._norm(hidden)
        self.out = zero_init_(nn.Linear(hidden, channels))

    def _norm(self, channels: int) -> LayerNorm:
        return LayerNorm(channels, path=self.path)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        zn = self.ln_in(z)
        m = torch.ones(z.shape[:-1], dtype=z.dtype, device=z.device) if mask is None else mask
        m = m.to(zn.dtype)[..., None]
        a = torch.sigmoid(self.a_gate(zn)) * self.a_proj(zn) * m
        b = torch.sigmoid(self.b_gate(zn)) * self.b_proj(zn) * m
        if self.direction == "outgoing":
            x = torch.einsum("...ikc,...jkc->...ijc", a, b)
        else:
            x = torch.einsum("...kic,...kjc->...ijc", a, b)
        y: torch.Tensor = torch.sigmoid(self.gate(zn)) * self.out(self.ln_out(x))
        return y


class CPTriangleMultiplication(TriangleMultiplication):
    """CP triangle update on a 2-D-sharded pair tensor; same state_dict as the serial twin.

    Example::

        cp = CPTriangleMultiplication(8, 8, "outgoing", mesh=mesh)
        cp.load_state_dict(serial.state_dict())
        dz = cp(zd, md)     # zd, md from pad_and_shard(..., pair_placements(...), pad_to=...)
    """

    def __init__(self, channels: int, hidden: int, direction: Direction, mesh: Any, *,
                 path: str = "reference") -> None:
        self.mesh = mesh
        super().__init__(channels, hidden, direction, path=path)

    def _norm(self, channels: int) -> LayerNorm:
        return ShardedLayerNorm(channels, self.mesh, path=self.path)

    def _lin(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        return replicated_linear(x, layer, self.mesh, PAIR_AXES)

    def forward_local(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The update on this rank's block ``z (..., a, b, c)`` with mask ``(..., a, b)``."""
        assert isinstance(self.ln_in, ShardedLayerNorm)
        assert isinstance(self.ln_out, ShardedLayerNorm)
        zn = self.ln_in.forward_local(z)
        a = torch.sigmoid(self._lin(zn, self.a_gate)) * self._lin(zn, self.a_proj)
        b = torch.sigmoid(self._lin(zn, self.b_gate)) * self._lin(zn, self.b_proj)
        if not is_planted("tri_mask_off"):
            m = mask.to(zn.dtype)[..., None]
            a, b = a * m, b * m
        if self.direction == "outgoing":
            rows = all_gather(a, self.mesh, "cp1", dim=-2)                         # a[I_r, :]
            cols = all_gather(transpose_pair(b, self.mesh), self.mesh, "cp0", dim=-3)  # b[J_c, :]^T
        else:
            rows = all_gather(transpose_pair(a, self.mesh), self.mesh, "cp1", dim=-2)  # a[:, I_r]^T
            cols = all_gather(b, self.mesh, "cp0", dim=-3)                         # b[:, J_c]
        x = torch.einsum("...ikc,...kjc->...ijc", rows, cols)
        return torch.sigmoid(self._lin(zn, self.gate)) * self._lin(self.ln_out.forward_local(x),
                                                                    self.out)

    def forward(self, z: DTensor, mask: DTensor) -> DTensor:  # type: ignore[override]
        out = self.forward_local(z.to_local(), mask.to_local())
        return from_local(out, z.device_mesh, z.placements, z.shape)
