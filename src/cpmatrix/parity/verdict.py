"""What the anti-vacuous checks compare and what the result means: pure, no collectives.

:mod:`.checks` gathers values over the mesh (the collectives); this module decides, from
a mesh's shape and values already at hand, what must be checked and whether it passed:

- :func:`sharding_problems` - every ``Shard(d)`` over a mesh axis > 1 really splits its
  tensor (``local.shape[d] < global.shape[d]``) and at least one tensor is split;
- :func:`replica_groups` - which local values must be bitwise identical over which axis;
  :func:`meta_problems` and :func:`replica_problems` judge what the ranks of one axis sent;
- :func:`grad_verdict` - each (full) grad present, finite and not all zero.

A mesh here is anything with ``shape``, ``ndim``, ``size(dim)`` and ``mesh_dim_names``
(a ``DeviceMesh``, or a fake in a unit test), so every branch runs without processes; the
collectives themselves are covered by the world tests (``tests/test_parity_worlds.py``).

Example (two ranks of one axis sent the same first tensor and different second ones)::

    >>> import torch
    >>> group = ReplicaGroup("cp0", 0, {"a": torch.zeros(2), "b": torch.ones(1)})
    >>> sent = [pack(group.tensors), pack({"a": torch.zeros(2), "b": torch.zeros(1)})]
    >>> print(*replica_problems(group, [0, 1], sent))
    b: differs over cp0 between rank 0 and ranks [1] (max abs 1; a missing all-reduce/broadcast?)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

__all__ = [
    "CheckOutcome",
    "MeshLike",
    "ReplicaGroup",
    "dim_names",
    "grad_verdict",
    "is_dtensor",
    "mesh_is_trivial",
    "meta_problems",
    "pack",
    "replica_groups",
    "replica_meta",
    "replica_problems",
    "sharding_problems",
]


class MeshLike(Protocol):
    """What the verdicts read of a ``DeviceMesh`` (a fake provides just this)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def ndim(self) -> int: ...

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None: ...

    def size(self, mesh_dim: int | None = None) -> int: ...


@dataclass(slots=True)
class CheckOutcome:
    """Problems found (empty: passed) and evidence lines for the log either way."""

    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def is_dtensor(value: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (checked without importing it eagerly).

    >>> is_dtensor(torch.zeros(1)), is_dtensor(None)
    (False, False)
    """
    return (
        isinstance(value, torch.Tensor)
        and hasattr(value, "placements")
        and hasattr(value, "to_local")
    )


def mesh_is_trivial(mesh: MeshLike) -> bool:
    """A 1x1 mesh: every collective is a no-op and local == global, by design."""
    return all(int(s) == 1 for s in mesh.shape)


def dim_names(mesh: MeshLike) -> tuple[str, ...]:
    """The mesh's dim names, or ``dim0``, ``dim1``, ... when it has none."""
    names = mesh.mesh_dim_names
    return tuple(names) if names else tuple(f"dim{i}" for i in range(mesh.ndim))


# --------------------------------------------------------------------------------------
# sharding active


def sharding_problems(named: Mapping[str, Any], mesh: MeshLike) -> CheckOutcome:
    """Every ``Shard(d)`` over a mesh axis of size > 1 must give ``local[d] < global[d]``,
    and at least one tensor must be sharded over such an axis. Skipped on a 1x1 mesh.

    Only local and global shapes are read, so this needs no collective: every rank judges
    its own shard, and ``check_parity`` merges the ranks' problems.

    >>> from types import SimpleNamespace
    >>> mesh = SimpleNamespace(shape=(1, 2), ndim=2, mesh_dim_names=("cp0", "cp1"),
    ...                        size=lambda d: (1, 2)[d])
    >>> sharding_problems({"x": torch.zeros(4)}, mesh).problems[0][:60]
    'mesh (1, 2) has an axis > 1 but no input is sharded over it:'
    """
    out = CheckOutcome()
    if mesh_is_trivial(mesh):
        out.skipped = "1x1 mesh: local == global by design"
        return out
    names = dim_names(mesh)
    for name, value in named.items():
        if not is_dtensor(value):
            continue  # a plain tensor among the inputs: the others still count
        local_shape = tuple(value.to_local().shape)
        global_shape = tuple(value.shape)
        for mesh_dim, placement in enumerate(value.placements):
            if not placement.is_shard() or mesh.size(mesh_dim) == 1:
                continue
            dim = placement.dim
            if local_shape[dim] < global_shape[dim]:  # one evidence line per real split
                out.lines.append(
                    f"{name}: local {local_shape} < global {global_shape} "
                    f"on dim {dim} over {names[mesh_dim]}"
                )
            else:  # a Shard that splits nothing: this rank holds the whole tensor
                out.problems.append(
                    f"{name}: Shard({dim}) over {names[mesh_dim]} (size {mesh.size(mesh_dim)}) "
                    f"but local shape {local_shape} == global {global_shape} on dim {dim}"
                )
    if not out.lines and not out.problems:
        out.problems.append(
            f"mesh {tuple(mesh.shape)} has an axis > 1 but no input is sharded over it: "
            f"declare Shard placements over {names} (the CP path would run as serial code)"
        )
    return out


# --------------------------------------------------------------------------------------
# replicated identical


@dataclass(frozen=True, slots=True)
class ReplicaGroup:
    """Local values that must be bitwise identical on every rank of one mesh axis."""

    #: The mesh dim's name (the order groups are gathered in: the same on every rank).
    label: str
    mesh_dim: int
    #: name -> this rank's local data, in the caller's order (the packing order).
    tensors: Mapping[str, torch.Tensor]


def replica_groups(named: Mapping[str, Any], mesh: MeshLike) -> list[ReplicaGroup]:
    """Which values must be identical over which mesh axis, sorted by axis name.

    A plain tensor must be identical over every axis > 1 (along every row and every column
    means everywhere); a DTensor's local data over every axis > 1 where it is
    ``Replicate`` (a ``Shard`` or ``Partial`` axis legitimately differs). Non-tensors are
    ignored.

    >>> from types import SimpleNamespace
    >>> mesh = SimpleNamespace(shape=(2, 1), ndim=2, mesh_dim_names=("cp0", "cp1"),
    ...                        size=lambda d: (2, 1)[d])
    >>> [(g.label, list(g.tensors)) for g in replica_groups({"x": torch.ones(1), "n": 3}, mesh)]
    [('cp0', ['x'])]
    """
    names = dim_names(mesh)
    by_dim: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            continue
        dtensor = is_dtensor(value)
        local: torch.Tensor = value.to_local() if dtensor else value  # type: ignore[attr-defined]
        for mesh_dim in range(mesh.ndim):
            if mesh.size(mesh_dim) == 1:
                continue
            if dtensor and not value.placements[mesh_dim].is_replicate():  # type: ignore[attr-defined]
                continue
            by_dim.setdefault(mesh_dim, {})[name] = local
    groups = [ReplicaGroup(names[d], d, tensors) for d, tensors in by_dim.items()]
    return sorted(groups, key=lambda g: g.label)


def replica_meta(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    """What must agree before bytes can be compared: names, shapes, dtypes, in order."""
    return [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors.items()]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def pack(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Every tensor's bytes, concatenated in order: one buffer, one gather per axis.

    >>> pack({"a": torch.zeros(2, dtype=torch.int16), "b": torch.ones(1)}).shape
    torch.Size([8])
    """
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat([_as_bytes(t) for t in tensors.values()])


def meta_problems(group: ReplicaGroup, ranks: Sequence[int], metas: Sequence[Any]) -> list[str]:
    """One problem if the ranks of ``group`` disagree on names, shapes or dtypes.

    ``metas[i]`` is :func:`replica_meta` of rank ``ranks[i]``. When they disagree the
    byte buffers differ in size, so no byte gather may follow (every rank sees the same
    metas and skips it alike).

    >>> group = ReplicaGroup("cp0", 0, {"x": torch.zeros(2)})
    >>> meta_problems(group, [0, 1], [replica_meta({"x": torch.zeros(2)})] * 2)
    []
    """
    first, *others = metas
    if any(m != first for m in others):
        return [f"over {group.label} (ranks {list(ranks)}): names/shapes/dtypes differ: "
                f"{list(metas)}"]
    return []


def replica_problems(
    group: ReplicaGroup, ranks: Sequence[int], gathered: Sequence[torch.Tensor]
) -> list[str]:
    """Compare what every rank of ``group`` sent (``gathered[i]``: :func:`pack` of rank
    ``ranks[i]``) with rank ``ranks[0]``'s, tensor by tensor, bitwise.

    Each tensor is compared over its own byte range of the buffers, so a replica that
    differs only in the last tensor is still named (and only it).
    """
    problems = []
    offset = 0
    for name, t in group.tensors.items():
        nbytes = t.numel() * t.element_size()
        parts = [buf[offset : offset + nbytes] for buf in gathered]
        offset += nbytes
        differing = [rank for rank, part in zip(ranks[1:], parts[1:], strict=True)
                     if not torch.equal(part, parts[0])]
        if not differing:
            continue
        worst = _worst_abs(t.dtype, parts) if t.is_floating_point() else 0.0
        problems.append(
            f"{name}: differs over {group.label} between rank {ranks[0]} and ranks "
            f"{differing} (max abs {worst:.3g}; a missing all-reduce/broadcast?)"
        )
    return problems


def _worst_abs(dtype: torch.dtype, parts: Sequence[torch.Tensor]) -> float:
    """Largest |other - first| over the ranks' copies (NaN counts as inf): evidence only.

    The byte slices are copied before being viewed as ``dtype``: a tensor packed after
    one of another element size starts at an offset ``view`` refuses (a float64 after
    three float32s starts at byte 12).
    """
    base = parts[0].clone().view(dtype).double()
    worst = 0.0
    for other in parts[1:]:
        diff = (other.clone().view(dtype).double() - base).abs()
        diff = diff.nan_to_num(nan=math.inf, posinf=math.inf)
        worst = max(worst, float(diff.max()))
    return worst


# --------------------------------------------------------------------------------------
# grads non-zero and finite


def grad_verdict(
    named: Mapping[str, torch.Tensor | None], *, allow_zero: Mapping[str, str] | None = None
) -> CheckOutcome:
    """Each grad (its full value) present, finite and not all zero.

    ``allow_zero[name] = reason`` exempts one grad from "not all zero", never from
    "finite": +/-inf and NaN fail, in real and complex grads alike.

    >>> grad_verdict({"w": torch.tensor([1.0, float("inf")])}).problems
    ['w: 1 non-finite elements']
    """
    out = CheckOutcome()
    allow_zero = allow_zero or {}
    for name, grad in named.items():
        if grad is None:
            out.problems.append(f"{name}: no gradient (not connected to the output?)")
            continue
        nonfinite = int((~torch.isfinite(grad)).sum())  # integer grads: always finite
        if nonfinite:
            out.problems.append(f"{name}: {nonfinite} non-finite elements")
            continue
        peak = float(grad.abs().max()) if grad.numel() else 0.0
        if peak > 0.0:
            out.lines.append(f"{name}: max abs {peak:.3g}")
        elif name in allow_zero:
            out.lines.append(f"{name}: all zero, allowed: {allow_zero[name]}")
        else:
            out.problems.append(f"{name}: all zero (vacuous: 0 == 0 passes)")
    return out
