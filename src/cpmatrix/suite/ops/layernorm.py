"""LayerNorm over the channel dim of a sharded tensor (pair ``(N, N, c)`` or sequence ``(S, d)``).

The channel dim is never sharded, so the normalization itself is local; what the CP
version adds is the gradient of the replicated affine parameters, which must be summed
over every mesh axis the activations are sharded on. That all-reduce is explicit
(:func:`~cpmatrix.suite.ops.collectives.replicate_grad`), so the mutant
``no_grad_allreduce`` can take it away.

Example::

    ln = ShardedLayerNorm(8, mesh)
    ln.load_state_dict(LayerNorm(8).state_dict())
    y = ln(pad_and_shard(z, mesh, pair_placements(z.ndim), pad_to=pair_pad(z, mesh)))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cpmatrix.suite.distribute import from_local
from cpmatrix.suite.ops.collectives import replicate_grad
from cpmatrix.suite.ops.common import check_path, sharded_axes

__all__ = ["LayerNorm", "ShardedLayerNorm", "layer_norm_local"]


def layer_norm_local(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                     path: str = "reference") -> torch.Tensor:
    """LayerNorm over the last dim: ``F.layer_norm`` or the Triton kernel (``path="kernel"``)."""
    if check_path(path) == "kernel":
        from cpmatrix.suite.kernels.layernorm import layer_norm

        return layer_norm(x, weight, bias, eps)
    return nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


class LayerNorm(nn.LayerNorm):
    """The serial twin: ``nn.LayerNorm`` over the last dim, with a ``path`` switch.

    Example: ``LayerNorm(8)(torch.randn(5, 5, 8))``.
    """

    def __init__(self, channels: int, eps: float = 1e-5, *, path: str = "reference",
                 **factory: Any) -> None:
        super().__init__(channels, eps=eps, **factory)
        self.path = check_path(path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_local(x, self.weight, self.bias, self.eps, self.path)


class ShardedLayerNorm(LayerNorm):
    """LayerNorm of a DTensor sharded anywhere but its last dim; state_dict of :class:`LayerNorm`.

    ``forward_local`` works on this rank's shard and takes the axes to all-reduce the
    parameter gradients over (default: both pair axes).
    """

    def __init__(self, channels: int, mesh: Any, eps: float = 1e-5, *,
                 path: str = "reference", **factory: Any) -> None:
        super().__init__(channels, eps=eps, path=path, **factory)
        self.mesh = mesh

    def forward_local(self, x: torch.Tensor,
                      axes: tuple[str, ...] = ("cp0", "cp1")) -> torch.Tensor:
        w = replicate_grad(self.weight, self.mesh, axes)
        b = replicate_grad(self.bias, self.mesh, axes)
        return layer_norm_local(x, w, b, self.eps, self.path)

    def forward(self, x: DTensor) -> DTensor:  # type: ignore[override]
        last = x.ndim - 1
        if any(getattr(p, "dim", None) == last for p in x.placements):
            raise ValueError("ShardedLayerNorm normalizes the last dim, which must not be "
                             f"sharded; got placements {x.placements}")
        y = self.forward_local(x.to_local(), sharded_axes(x))
        return from_local(y, x.device_mesh, x.placements, x.shape)
