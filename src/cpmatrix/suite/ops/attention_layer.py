"""Multi-head self-attention over a sequence: serial twin and the ring-attention version.

``x (..., S, dim)`` is projected to ``heads`` queries, keys and values of ``head_dim``
(no bias), attended, and projected back by ``o``, which starts at zero (AlphaFold's
final-projection init: the residual branch starts as identity). Parity tests must
perturb ``o`` first or everything downstream of it is vacuously zero.

The CP version takes ``x`` with the sequence dim sharded (for example
:func:`~cpmatrix.suite.distribute.seq_placements` over the flattened mesh), runs
:func:`~cpmatrix.suite.ops.ring_attention.ring_attention_local` over the mesh axes that
shard the sequence, and all-reduces the projection gradients over every sharded axis.

Example::

    serial = Attention(16, heads=2, head_dim=4)
    cp = CPAttention(16, heads=2, head_dim=4, mesh=mesh)
    cp.load_state_dict(serial.state_dict())
    xd = pad_and_shard(x, mesh, seq_placements(x.ndim - 2))          # x: (S, 16)
    md = pad_and_shard(mask, mesh, seq_placements(mask.ndim - 1))    # mask: (S,) bool
    undistribute(cp(xd, md), x.shape)  # == serial(x, mask)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from cpmatrix.suite.distribute import from_local
from cpmatrix.suite.ops.collectives import Ring
from cpmatrix.suite.ops.common import check_path, replicated_linear, sharded_axes, zero_init_
from cpmatrix.suite.ops.ring_attention import attention_serial, ring_attention_local

__all__ = ["Attention", "CPAttention"]


class Attention(nn.Module):
    """Serial multi-head self-attention with a key mask; ``o`` zero-initialized.

    Example: ``Attention(16, 2, 4)(x, mask)`` with ``x (S, 16)``, ``mask (S,)`` bool.
    """

    def __init__(self, dim: int, heads: int, head_dim: int, *, path: str = "reference") -> None:
        super().__init__()
        self.heads, self.head_dim, self.path = heads, head_dim, check_path(path)
        inner = heads * head_dim
        self.q = nn.Linear(dim, inner, bias=False)
        self.k = nn.Linear(dim, inner, bias=False)
        self.v = nn.Linear(dim, inner, bias=False)
        self.o = zero_init_(nn.Linear(inner, dim))

    def _split(self, t: torch.Tensor) -> torch.Tensor:  # (..., S, H*d) -> (..., H, S, d)
        return t.reshape(*t.shape[:-1], self.heads, self.head_dim).transpose(-3, -2)

    def _merge(self, t: torch.Tensor) -> torch.Tensor:  # (..., H, S, d) -> (..., S, H*d)
        return t.transpose(-3, -2).flatten(-2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = (self._split(lin(x)) for lin in (self.q, self.k, self.v))
        km = None if mask is None else mask.bool()[..., None, :]
        if self.path == "kernel":  # the kernel path on one rank: a ring of one
            out = ring_attention_local(q, k, v, Ring((0,), 0), key_mask=km, path="kernel")
        else:
            out = attention_serial(q, k, v, key_mask=km)
        y: torch.Tensor = self.o(self._merge(out))
        return y


class CPAttention(Attention):
    """Ring-attention version of :class:`Attention` (same parameters and state_dict)."""

    def __init__(self, dim: int, heads: int, head_dim: int, mesh: Any, *,
                 path: str = "reference") -> None:
        super().__init__(dim, heads, head_dim, path=path)
        self.mesh = mesh

    def forward_local(self, x: torch.Tensor, mask: torch.Tensor | None, ring: Ring,
                      grad_axes: tuple[str, ...]) -> torch.Tensor:
        """Attention on this rank's shard: ``x (..., S_local, dim)``, ``mask (..., S_local)``."""
        q, k, v = (self._split(replicated_linear(x, lin, self.mesh, grad_axes))
                   for lin in (self.q, self.k, self.v))
        km = None if mask is None else mask.bool()[..., None, :]
        out = ring_attention_local(q, k, v, ring, key_mask=km, path=self.path)
        return replicated_linear(self._merge(out), self.o, self.mesh, grad_axes)

    def forward(self, x: DTensor, mask: DTensor | None = None) -> DTensor:  # type: ignore[override]
        seq = x.ndim - 2
        names = x.device_mesh.mesh_dim_names or ()
        ring_axes = tuple(n for n, p in zip(names, x.placements, strict=True)
                          if isinstance(p, Shard) and p.dim == seq)
        if mask is not None and tuple(p.dim if isinstance(p, Shard) else None
                                      for p in mask.placements) != tuple(
                seq if isinstance(p, Shard) else None for p in x.placements):
            raise ValueError(f"mask (..., S) must be sharded like x's sequence dim; x: "
                             f"{x.placements}, mask: {mask.placements}")
        ring = Ring.along(self.mesh, ring_axes)
        out = self.forward_local(x.to_local(), None if mask is None else mask.to_local(),
                                 ring, sharded_axes(x))
        return from_local(out, x.device_mesh, x.placements, x.shape)
