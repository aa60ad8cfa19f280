"""The layout half of the toolkit's distributor: pad, re-lay out, remap, then shard.

The layout (:class:`Layout`) is pure: it depends on the serial features and the world size
only. Every plain axis is padded to a multiple of the world size (R*C), so any way of
sharding it over ("cp0", "cp1") divides evenly; a grouped axis (atoms, grouped by their
token) is packed per world-size chunk of its parent with a common capacity, so its shards
follow its parent's shards. :func:`distribute` applies a layout and shards the result.

Example::

    >>> import torch
    >>> feats = {"atom_to_token": torch.tensor([0, 0, 0, 1, 2]),
    ...          "token_index": torch.arange(3)}
    >>> lay = compute_layout(feats, world_size=2)
    >>> lay.axes["N"].padded, lay.axes["A"].padded
    (4, 8)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cpmatrix.parity.features import (
    AXES,
    FEATURES,
    AxisName,
    AxisSpec,
    FeatureSpec,
    _axis_sizes,
    _check_rank,
    placements_of,
)

__all__ = ["AxisLayout", "Layout", "compute_layout", "distribute"]

# --------------------------------------------------------------------------------------
# layout (pure)


@dataclass(frozen=True, slots=True)
class AxisLayout:
    """Where each serial element of an axis sits in the CP (padded) layout."""

    name: AxisName
    size: int
    padded: int
    #: ``positions[i]``: the padded index of serial element ``i`` (LongTensor, shape (size,)).
    positions: torch.Tensor
    #: Number of equal chunks the padded axis is cut into (the world size).
    chunks: int

    def valid(self) -> torch.Tensor:
        """Bool mask over the padded axis: True where a serial element sits."""
        mask = torch.zeros(self.padded, dtype=torch.bool)
        mask[self.positions] = True
        return mask


@dataclass(frozen=True, slots=True)
class Layout:
    """The CP layout of every symbolic axis for one sample and world size."""

    axes: Mapping[AxisName, AxisLayout]
    world_size: int

    def to_cp(
        self,
        value: torch.Tensor,
        axes: Sequence[AxisName | int | None],
        *,
        pad: float = 0,
        index_of: AxisName | None = None,
    ) -> torch.Tensor:
        """A serial-layout tensor in the CP layout: padded and re-laid out along ``axes``.

        ``index_of``: the values are indices into that axis; they are remapped, and padded
        entries get the first index of the same chunk (so a local gather stays local).
        """
        _check_rank(value, axes)
        out = value
        if index_of is not None:
            target = self.axes[index_of]
            out = target.positions.to(value.device)[value.long()].to(value.dtype)
        for dim, axis in enumerate(axes):
            if not isinstance(axis, str):
                continue
            lay = self.axes[axis]
            shape = list(out.shape)
            shape[dim] = lay.padded
            fill = pad
            padded = torch.full(shape, fill, dtype=out.dtype, device=out.device)
            padded = padded.index_copy(dim, lay.positions.to(out.device), out)
            if index_of is not None and dim == 0:
                padded = self._pad_indices(padded, lay, self.axes[index_of])
            out = padded
        return out

    @staticmethod
    def _pad_indices(t: torch.Tensor, own: AxisLayout, target: AxisLayout) -> torch.Tensor:
        valid = own.valid().to(t.device)
        chunk = torch.arange(own.padded, device=t.device) // (own.padded // own.chunks)
        first = (chunk * (target.padded // target.chunks)).to(t.dtype)
        shape = [own.padded] + [1] * (t.ndim - 1)
        return torch.where(valid.reshape(shape), t, first.reshape(shape).expand_as(t))

    def to_serial(self, value: torch.Tensor, axes: Sequence[AxisName | int | None]) -> torch.Tensor:
        """A CP-layout (full, padded) tensor back in the serial layout: padding dropped.

        Differentiable (``index_select``), so it also maps gradients.
        """
        value = _full(value)
        _check_rank(value, axes)
        for dim, axis in enumerate(axes):
            if isinstance(axis, str):
                lay = self.axes[axis]
                if value.shape[dim] != lay.padded:
                    raise ValueError(
                        f"dim {dim} has size {value.shape[dim]}, axis {axis!r} is "
                        f"padded to {lay.padded}: not a CP-layout tensor"
                    )
                value = value.index_select(dim, lay.positions.to(value.device))
        return value

    def valid(self, axis: AxisName) -> torch.Tensor:
        return self.axes[axis].valid()


def _full(value: Any) -> Any:
    full_tensor = getattr(value, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else value


def _round_up(n: int, k: int) -> int:
    return max(k, math.ceil(n / k) * k)


def compute_layout(
    features: Mapping[str, torch.Tensor],
    world_size: int,
    *,
    specs: Iterable[FeatureSpec] = FEATURES,
    axes: Mapping[str, AxisSpec] = AXES,
) -> Layout:
    """The CP layout of the axes that ``features`` use, for ``world_size`` ranks. Pure.

    Example::

        >>> import torch
        >>> feats = {"atom_to_token": torch.tensor([0, 0, 0, 1, 2]),
        ...          "token_index": torch.arange(3)}
        >>> lay = compute_layout(feats, world_size=2)
        >>> lay.axes["N"].padded, lay.axes["A"].padded, lay.axes["A"].positions.tolist()
        (4, 8, [0, 1, 2, 3, 4])
    """
    by_name = {s.name: s for s in specs}
    sizes = _axis_sizes(features, by_name)
    result: dict[str, AxisLayout] = {}
    for name, size in sizes.items():
        if axes.get(name, AxisSpec(name, "")).group_by is None:
            padded = _round_up(size, world_size)
            result[name] = AxisLayout(name, size, padded, torch.arange(size), world_size)
    for name, size in sizes.items():
        group_by = axes.get(name, AxisSpec(name, "")).group_by
        if group_by is None:
            continue
        if group_by not in features:
            raise ValueError(
                f"axis {name!r} is laid out by {group_by!r}, which is missing: "
                f"synthesize the full feature set, then take a subset"
            )
        parent_axis = by_name[group_by].index_of
        if parent_axis is None or parent_axis not in result:
            raise ValueError(f"{group_by!r} must index a plain axis present in the features")
        parent = result[parent_axis]
        owner = features[group_by].long().cpu()
        chunk = parent.positions[owner] // (parent.padded // world_size)
        counts = torch.bincount(chunk, minlength=world_size)
        cap = max(1, int(counts.max()))
        # rank of each element inside its chunk (owners are sorted: stable order)
        starts = torch.cumsum(counts, 0) - counts
        within = torch.arange(size) - starts[chunk]
        positions = chunk * cap + within
        result[name] = AxisLayout(name, size, world_size * cap, positions, world_size)
    return Layout(result, world_size)


# --------------------------------------------------------------------------------------
# the toolkit's distributor


def distribute(
    value: torch.Tensor,
    mesh: Any,
    placements: Sequence[Any],
    *,
    axes: Sequence[AxisName | int | None] | None = None,
    layout: Layout | None = None,
    pad: float = 0,
    index_of: AxisName | None = None,
    requires_grad: bool = False,
) -> Any:
    """The toolkit's distributor: serial test value -> CP DTensor (pad, re-lay out, remap,
    shard), for the inputs and features of any project's parity tests.

    It is test infrastructure: the project's own sharding code (the reference suite's
    :func:`cpmatrix.suite.pad_and_shard`, say) is code under test and stays the project's;
    plug it into :class:`SyntheticDataModule` (``distributor=``) so tests exercise it.
    ``mesh`` may be the cell's mesh or a sub-mesh of it (``cell.mesh["cp1"]``).

    With ``layout`` and ``axes`` the tensor is first put in the CP layout
    (:meth:`Layout.to_cp`) and every sharded dim must then divide evenly. Without a layout
    it is sharded as is (torch's uneven chunks: a useful adversarial case, e.g. 7 rows on 4
    ranks). Every rank uses its own copy (no scatter from rank 0), so ranks that disagree on
    the input are caught by the replicated-identical check instead of silently overwritten.
    ``placements`` are ``Placement`` objects or codes (``"S0"``, ``"R"``).

    Example::

        x_cp = distribute(x, cell.mesh, ("S0", "R"), axes=("N", None), layout=batch.layout)
    """
    from torch.distributed.tensor import distribute_tensor

    places = (
        placements_of(placements)
        if all(isinstance(p, str) for p in placements)
        else list(placements)
    )
    if len(places) != mesh.ndim:
        raise ValueError(f"{len(places)} placements for a {mesh.ndim}-D mesh: {places}")
    local = value.detach()
    if layout is not None:
        if axes is None:
            raise ValueError("distribute(..., layout=...) needs axes=(...) naming each dim")
        local = layout.to_cp(local, axes, pad=pad, index_of=index_of)
        for dim, ways in _shard_ways(places, mesh).items():
            if local.shape[dim] % ways:
                raise ValueError(
                    f"dim {dim} of size {local.shape[dim]} does not divide over "
                    f"{ways} shards; name its axis in axes= so it is padded"
                )
    out = distribute_tensor(local, mesh, places, src_data_rank=None)
    return out.requires_grad_(requires_grad) if requires_grad else out


def _shard_ways(places: Sequence[Any], mesh: Any) -> dict[int, int]:
    ways: dict[int, int] = {}
    for mesh_dim, p in enumerate(places):
        if p.is_shard():
            ways[p.dim] = ways.get(p.dim, 1) * mesh.size(mesh_dim)
    return ways
