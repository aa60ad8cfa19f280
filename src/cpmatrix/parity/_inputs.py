"""The inputs of :func:`check_parity`: drawn once, handed to both sides, mapped back.

Private: cases use :mod:`cpmatrix.parity`'s public names only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cpmatrix.parity.compare import to_full
from cpmatrix.parity.data import FeatureBatch, distribute
from cpmatrix.parity.dtypes import storage_dtype
from cpmatrix.parity.errors import ParityError
from cpmatrix.parity.verdict import is_dtensor

__all__ = [
    "Axes",
    "Inputs",
    "Leaf",
    "Placements",
    "TensorSpec",
    "draw",
    "materialize",
    "output_axes_map",
    "serial_layout",
    "tensors_of",
]

Axes = tuple[str | int | None, ...]
#: Per input: placements over the cell's mesh (``[Shard(0), Replicate()]``, ``("S0", "R")``),
#: over named dims of it (``{"cp1": Shard(1)}``: a DTensor on ``cell.mesh["cp1"]``), or None.
Placements = Sequence[Any] | Mapping[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """An activation input: drawn from ``cell.generator`` (or given), identical on all ranks.

    ``shape`` may name symbolic axes of a :class:`FeatureBatch` among the inputs (``"N"``:
    the number of tokens); such dims go through the batch's layout (padding, re-layout)
    on the CP side and come back with :meth:`Layout.to_serial` for the grad comparison.

    Example::

        TensorSpec(shape=("N", 16))                 # tokens x 16, standard normal
        TensorSpec(shape=(7, 4), requires_grad=False)
        TensorSpec.of(my_tensor, axes=("N", None))  # a given serial value
    """

    shape: tuple[int | str, ...]
    dtype: torch.dtype | None = None
    requires_grad: bool = True
    scale: float = 1.0
    value: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        value: torch.Tensor,
        *,
        axes: Sequence[str | int | None] | None = None,
        requires_grad: bool | None = None,
    ) -> TensorSpec:
        shape = tuple(
            a if isinstance(a, str) else int(value.shape[i])
            for i, a in enumerate(axes or [None] * value.ndim)
        )
        grad = value.is_floating_point() if requires_grad is None else requires_grad
        return cls(shape=shape, dtype=value.dtype, requires_grad=grad, value=value)


@dataclass(slots=True)
class Leaf:
    """A differentiable input: the serial leaf, the CP leaf, and its axes (if laid out)."""

    serial: torch.Tensor
    cp: Any
    axes: Axes | None


@dataclass(slots=True)
class Inputs:
    serial: dict[str, Any] = field(default_factory=dict)
    cp: dict[str, Any] = field(default_factory=dict)
    leaves: dict[str, Leaf] = field(default_factory=dict)
    batch: FeatureBatch | None = None


def draw(
    gen: torch.Generator, shape: Sequence[int], dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """Standard normal in float64 from ``gen`` (same on every rank), then cast."""
    x = torch.randn(tuple(shape), generator=gen, dtype=torch.float64, device=gen.device)
    return x.to(device=device, dtype=dtype)


def find_batch(inputs: Mapping[str, Any]) -> FeatureBatch | None:
    batches = [v for v in inputs.values() if isinstance(v, FeatureBatch)]
    if len(batches) > 1:
        raise ParityError("setup", "at most one FeatureBatch among the inputs")
    return batches[0] if batches else None


def _sub_mesh(cell: Any, name: str, places: Mapping[str, Any]) -> tuple[Any, list[Any]]:
    """``{"cp1": Shard(1)}``: the sub-mesh ``cell.mesh["cp1"]`` and its placements."""
    known = tuple(cell.mesh.mesh_dim_names or ())
    unknown = [d for d in places if d not in known]
    if unknown or not places:
        raise ParityError(
            "setup", f"input {name!r}: placements over mesh dims {list(places)}; the cell's "
                     f"mesh has {list(known)}"
        )
    dims = tuple(places)
    return cell.mesh[dims[0] if len(dims) == 1 else dims], list(places.values())


def materialize(
    cell: Any, inputs: Mapping[str, Any], placements: Mapping[str, Placements]
) -> Inputs:
    """Serial and CP keyword arguments, drawn in ``inputs`` order from ``cell.generator``."""
    from torch.distributed.tensor import Replicate

    unknown = sorted(set(placements) - set(inputs))
    if unknown:
        raise ParityError("setup", f"placements for unknown inputs {unknown}")
    out = Inputs(batch=find_batch(inputs))
    for name, value in inputs.items():
        if isinstance(value, FeatureBatch):
            out.serial[name], out.cp[name] = value.serial, value.cp
            continue
        if isinstance(value, torch.Tensor) and not is_dtensor(value):
            value = TensorSpec.of(value)
        if not isinstance(value, TensorSpec):
            out.serial[name] = out.cp[name] = value  # ints, flags, None: passed as is
            continue
        axes = tuple(a if isinstance(a, str) else None for a in value.shape)
        laid_out = any(isinstance(a, str) for a in value.shape)
        if laid_out and out.batch is None:
            raise ParityError(
                "setup",
                f"input {name!r} has symbolic axes {value.shape} but "
                f"no FeatureBatch is among the inputs",
            )
        shape = [
            out.batch.axis_size(a) if isinstance(a, str) and out.batch else int(a)
            for a in value.shape
        ]
        dtype = value.dtype or storage_dtype(cell)
        if value.value is not None:
            serial = value.value.detach().to(device=cell.device).clone()
        else:
            serial = draw(cell.generator, shape, dtype, cell.device) * value.scale
        grad = value.requires_grad and (serial.is_floating_point() or serial.is_complex())
        places = placements.get(name, [Replicate()] * cell.mesh.ndim)
        if places is None:
            cp: Any = serial.detach().clone()
        elif isinstance(places, Mapping):
            if laid_out:
                raise ParityError("setup", f"input {name!r}: symbolic axes are laid out over "
                                           f"the cell's whole mesh, not over {list(places)}")
            cp = distribute(serial, *_sub_mesh(cell, name, places))
        elif laid_out and out.batch is not None:
            cp = out.batch.distribute(serial, places, axes)
        else:
            cp = distribute(serial, cell.mesh, places)
        if grad:
            serial.requires_grad_(True)
            cp.requires_grad_(True)
            out.leaves[name] = Leaf(serial, cp, axes if laid_out else None)
        out.serial[name], out.cp[name] = serial, cp
    return out


def tensors_of(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The tensors among ``values`` (nested mappings flattened), names prefixed."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, Mapping):
            out.update(tensors_of(value, f"{prefix}{name}."))
        elif isinstance(value, torch.Tensor):
            out[f"{prefix}{name}"] = value
    return out


def output_axes_map(
    output_axes: Mapping[str, Axes] | Axes | None, leaves: Mapping[str, Any]
) -> dict[str, Axes]:
    if output_axes is None:
        return {}
    if isinstance(output_axes, Mapping):
        unknown = sorted(set(output_axes) - set(leaves))
        if unknown:
            raise ParityError(
                "setup", f"output_axes for unknown outputs {unknown} (outputs: {sorted(leaves)})"
            )
        return {k: tuple(v) for k, v in output_axes.items()}
    if len(leaves) != 1:
        raise ParityError("setup", f"output_axes as a tuple needs one output, got {sorted(leaves)}")
    return {next(iter(leaves)): tuple(output_axes)}


def serial_layout(ins: Inputs, value: Any, axes: Axes | None) -> Any:
    """A CP value as a full tensor in the serial layout (padding of laid-out axes dropped)."""
    full = to_full(value)
    if axes is None or full is None:
        return full
    if ins.batch is None:
        raise ParityError("setup", "output/input axes need a FeatureBatch among the inputs")
    return ins.batch.to_serial(full, axes)
