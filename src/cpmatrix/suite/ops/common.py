"""Small helpers shared by the CP layers: replicated parameters on sharded activations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from cpmatrix.suite.ops.collectives import replicate_grad

__all__ = ["PAIR_AXES", "PATHS", "check_path", "replicated_linear", "sharded_axes", "zero_init_"]

#: The mesh axes a pair tensor is sharded over (rows over cp0, columns over cp1).
PAIR_AXES = ("cp0", "cp1")
PATHS = ("reference", "kernel")


def check_path(path: str) -> str:
    """Validate a ``path`` argument (``reference`` or ``kernel``)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return path


def sharded_axes(x: DTensor) -> tuple[str, ...]:
    """Mesh dims along which ``x`` is sharded (the axes a parameter grad must be summed over)."""
    names = x.device_mesh.mesh_dim_names or ()
    return tuple(n for n, p in zip(names, x.placements, strict=True) if isinstance(p, Shard))


def replicated_linear(x: torch.Tensor, layer: nn.Linear, mesh: Any,
                      axes: Sequence[str]) -> torch.Tensor:
    """``layer(x)`` on a local shard, with the weight and bias gradients all-reduced over ``axes``.

    Example: ``q = replicated_linear(x_local, self.q, mesh, ("cp0", "cp1"))``.
    """
    w = replicate_grad(layer.weight, mesh, axes)
    b = None if layer.bias is None else replicate_grad(layer.bias, mesh, axes)
    return nn.functional.linear(x, w, b)


def zero_init_(layer: nn.Linear) -> nn.Linear:
    """Zero a final projection, as AlphaFold does so each residual block starts as identity.

    Parity tests must perturb such parameters first, or outputs and gradients through
    them are vacuously zero on both sides.
    """
    with torch.no_grad():
        layer.weight.zero_()
        if layer.bias is not None:
            layer.bias.zero_()
    return layer
