"""Pair-biased row attention (triangle attention around the starting node, AF2 Alg. 13).

For every row ``i`` of a pair tensor ``z (..., N, N, c)``, the entries ``z_ij`` attend to
the entries ``z_ik`` of the same row, with a bias taken from the pair itself::

    zn = LayerNorm(z)
    q_ij, k_ik, v_ik = projections of zn (heads h, head_dim d)
    b^h_jk = bias_proj(zn)_jk                                   (one scalar per head)
    o_ij   = sum_k softmax_k(q_ij . k_ik / sqrt(d) + b^h_jk ; m_ik) v_ik
    out    = out_proj(sigmoid(gate(zn)) * o)                    out_proj zero-initialized

CP layout: rank ``(r, c)`` holds ``z[I_r, J_c]``. The keys of row ``i`` are spread over
the ranks of the mesh row (cp1), so K/V go around a ring along cp1
(:func:`~cpmatrix.suite.ops.ring_attention.ring_attention_local`). The bias rows needed
are ``b[J_c, :]`` — the query *columns* of this rank — which is the transposed bias,
gathered along cp0: ``b^T[:, J_c]``. Padded keys are masked (``m = 0``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cpmatrix.suite.distribute import from_local
from cpmatrix.suite.ops.collectives import Ring, all_gather, transpose_pair
from cpmatrix.suite.ops.common import PAIR_AXES, check_path, replicated_linear, zero_init_
from cpmatrix.suite.ops.layernorm import LayerNorm, ShardedLayerNorm
from cpmatrix.suite.ops.ring_attention import attention_serial, ring_attention_local

__all__ = ["CPPairAttention", "PairAttention"]


class PairAttention(nn.Module):
    """Serial pair-biased row attention with a pair mask.

    Example: ``PairAttention(8, heads=2, head_dim=4)(z, mask)`` with ``z (N, N, 8)``.
    """

    def __init__(self, channels: int, heads: int, head_dim: int, *,
                 path: str = "reference") -> None:
        super().__init__()
        self.heads, self.head_dim, self.path = heads, head_dim, check_path(path)
        inner = heads * head_dim
        self.ln = self._norm(channels)
        self.q = nn.Linear(channels, inner, bias=False)
        self.k = nn.Linear(channels, inner, bias=False)
        self.v = nn.Linear(channels, inner, bias=False)
        self.bias_proj = nn.Linear(channels, heads, bias=False)
        self.gate = nn.Linear(channels, inner)
        self.out = zero_init_(nn.Linear(inner, channels))

    def _norm(self, channels: int) -> LayerNorm:
        return LayerNorm(channels, path=self.path)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:  # (..., i, j, H*d) -> (..., i, H, j, d)
        return t.reshape(*t.shape[:-1], self.heads, self.head_dim).transpose(-3, -2)

    def _finish(self, zn_gate: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(zn_gate) * o.transpose(-3, -2).flatten(-2)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        zn = self.ln(z)
        q, k, v = (self._heads(lin(zn)) for lin in (self.q, self.k, self.v))
        bias = self.bias_proj(zn).movedim(-1, -3)[..., None, :, :, :]  # (..., 1, H, j, k)
        km = None if mask is None else mask.bool()[..., :, None, :]     # (..., i, 1, k)
        if self.path == "kernel":  # the kernel path on one rank: a ring of one
            o = ring_attention_local(q, k, v, Ring((0,), 0), key_mask=km, bias=bias,
                                     path="kernel")
        else:
            o = attention_serial(q, k, v, key_mask=km, bias=bias)
        y: torch.Tensor = self.out(self._finish(self.gate(zn), o))
        return y


class CPPairAttention(PairAttention):
    """CP pair-biased row attention (ring along cp1); same state_dict as the serial twin."""

    def __init__(self, channels: int, heads: int, head_dim: int, mesh: Any, *,
                 path: str = "reference") -> None:
        self.mesh = mesh
        super().__init__(channels, heads, head_dim, path=path)

    def _norm(self, channels: int) -> LayerNorm:
        return ShardedLayerNorm(channels, self.mesh, path=self.path)

    def _lin(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        return replicated_linear(x, layer, self.mesh, PAIR_AXES)

    def forward_local(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attention on this rank's block ``z (..., a, b, c)`` with mask ``(..., a, b)``."""
        assert isinstance(self.ln, ShardedLayerNorm)
        zn = self.ln.forward_local(z)
        q, k, v = (self._heads(self._lin(zn, lin)) for lin in (self.q, self.k, self.v))
        b_loc = self._lin(zn, self.bias_proj)                            # b[I_r, J_c]
        b_cols = all_gather(transpose_pair(b_loc, self.mesh), self.mesh, "cp0", dim=-3)
        # b_cols[k, j] = b[j, k] for j in J_c and every k  ->  (..., 1, H, j, k)
        bias = b_cols.movedim(-1, -3).transpose(-1, -2)[..., None, :, :, :]
        ring = Ring.along(self.mesh, ("cp1",))
        o = ring_attention_local(q, k, v, ring, key_mask=mask.bool()[..., :, None, :],
                                 bias=bias, path=self.path)
        return self._lin(self._finish(self._lin(zn, self.gate), o), self.out)

    def forward(self, z: DTensor, mask: DTensor) -> DTensor:  # type: ignore[override]
        out = self.forward_local(z.to_local(), mask.to_local())
        return from_local(out, z.device_mesh, z.placements, z.shape)
