"""What the anti-vacuous checks compare and what the result means: pure, no collectives.

:mod:`.checks` gathers values over the mesh (the collectives); this module decides, from
a mesh's shape and values already at hand, what must be checked and whether it passed:

- :func:`placed` - where a DTensor lies on the cell's mesh: for each dim of its *own* mesh
  (the cell's mesh, a sub-mesh such as ``mesh["cp1"]``, a flattened one), the cell-mesh
  dims it runs along (:func:`mesh_axes`); :func:`placement_problems` names a DTensor whose
  mesh is not part of the cell's mesh;
- :func:`sharding_problems` - every ``Shard(d)`` over a mesh axis > 1 really splits its
  tensor (``local.shape[d] < global.shape[d]``) and at least one tensor is split;
- :func:`replica_groups` - which local values must be bitwise identical over which axis
  (:func:`identical_dims`); :func:`meta_problems` and :func:`replica_problems` judge what
  the ranks of one axis sent;
- :func:`grad_verdict` - each (full) grad present, finite and not all zero.

A mesh here is anything with ``shape``, ``ndim``, ``size(dim)`` and ``mesh_dim_names``
(a ``DeviceMesh``, or a fake in a unit test), and ``mesh`` (its ranks) where a DTensor's
own mesh is compared with it, so every branch runs without processes; the collectives
themselves are covered by the world tests (``tests/test_parity_worlds.py``,
``tests/test_parity_submesh.py``).

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
    "identical_dims",
    "is_dtensor",
    "mesh_axes",
    "mesh_is_trivial",
    "meta_problems",
    "pack",
    "placed",
    "placement_problems",
    "replica_groups",
    "replica_meta",
    "replica_problems",
    "sharding_problems",
]

_IN_THE_CELL = "not part of the cell's mesh"


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
    #: One line of evidence for the report (``sharding_active``: what was split over what).
    summary: str = ""

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
# where a DTensor lies on the cell's mesh


def mesh_axes(own: Any, mesh: Any) -> tuple[tuple[int, ...], ...]:
    """For each dim of ``own`` (a DTensor's mesh), the dims of the cell's ``mesh`` it runs
    along; ``ValueError`` when ``own`` is not part of ``mesh``.

    Read from the ranks alone (``own.mesh``, ``mesh.mesh``): ``mesh["cp1"]`` runs along
    ``(1,)``, the flattened mesh along ``(0, 1)``, the cell's mesh itself along ``(0,), (1,)``.
    Part of the cell's mesh means: the ranks of ``own`` are distinct ranks of ``mesh``, and
    each dim of ``own`` covers exactly the ranks of a box of cell dims (a dim of size 1 runs
    along none). Two dims of ``own`` then never share a cell dim: their plane would hold
    more distinct ranks than the box of their cell dims has.

    >>> from types import SimpleNamespace
    >>> cell = SimpleNamespace(mesh=torch.arange(4).reshape(2, 2), shape=(2, 2), ndim=2,
    ...                        mesh_dim_names=("cp0", "cp1"))
    >>> def sub(ranks, names):
    ...     return SimpleNamespace(mesh=torch.tensor(ranks), mesh_dim_names=names)
    >>> mesh_axes(sub([2, 3], ("cp1",)), cell), mesh_axes(sub([0, 1, 2, 3], ("flat",)), cell)
    (((1,),), ((0, 1),))
    >>> mesh_axes(sub([0, 3], ("diag",)), cell)
    Traceback (most recent call last):
    ...
    ValueError: its dim diag (2 ranks) runs across the cell's dims ('cp0', 'cp1') (4 ranks)
    """
    cell_ranks, ranks = mesh.mesh, own.mesh
    where = {int(r): i for i, r in enumerate(cell_ranks.reshape(-1).tolist())}
    flat = [int(r) for r in ranks.reshape(-1).tolist()]
    outside = [r for r in flat if r not in where]
    if outside:
        raise ValueError(f"its ranks {outside} are outside the cell's mesh "
                         f"{cell_ranks.tolist()}")
    if len(set(flat)) != len(flat):
        raise ValueError(f"its ranks {ranks.tolist()} repeat")
    index = torch.tensor([where[r] for r in flat])
    coords = torch.column_stack(torch.unravel_index(index, tuple(cell_ranks.shape)))
    coords = coords.reshape(*ranks.shape, cell_ranks.ndim)
    names, cell_names = dim_names(own), dim_names(mesh)
    spans: list[tuple[int, ...]] = []
    for d in range(ranks.ndim):
        varies = (coords != coords.narrow(d, 0, 1)).reshape(-1, cell_ranks.ndim).any(0)
        span = tuple(int(c) for c in varies.nonzero().reshape(-1).tolist())
        box = math.prod(int(cell_ranks.shape[c]) for c in span)
        if box != int(ranks.shape[d]):
            raise ValueError(
                f"its dim {names[d]} ({int(ranks.shape[d])} ranks) runs across the cell's "
                f"dims {tuple(cell_names[c] for c in span)} ({box} ranks)"
            )
        spans.append(span)
    return tuple(spans)


@dataclass(frozen=True, slots=True)
class Placed:
    """One dim of a DTensor's own mesh, seen from the cell's mesh."""

    #: The dim's name on the DTensor's mesh (``cp1``, or a flattened ``cp0_cp1``).
    name: str
    size: int
    #: The cell-mesh dims it runs along (empty for a dim of size 1).
    cell_dims: tuple[int, ...]
    placement: Any


def placed(value: Any, mesh: Any) -> list[Placed]:
    """Each placement of the DTensor ``value`` with the dim of its own mesh it applies to
    and the cell-mesh dims that dim runs along; ``ValueError`` when its mesh is not part of
    the cell's ``mesh`` (:func:`mesh_axes`) or the placements do not fit it.

    A duck-typed DTensor without a ``device_mesh`` is laid out over the cell's mesh itself.

    >>> from types import SimpleNamespace
    >>> from torch.distributed.tensor import Replicate, Shard
    >>> cell = SimpleNamespace(mesh=torch.arange(4).reshape(2, 2), shape=(2, 2), ndim=2,
    ...                        mesh_dim_names=("cp0", "cp1"), size=lambda d: (2, 2)[d])
    >>> cp1 = SimpleNamespace(mesh=torch.tensor([0, 1]), ndim=1, mesh_dim_names=("cp1",),
    ...                       size=lambda d: 2)
    >>> w = SimpleNamespace(device_mesh=cp1, placements=(Shard(0),))
    >>> [(p.name, p.size, p.cell_dims, p.placement) for p in placed(w, cell)]
    [('cp1', 2, (1,), Shard(dim=0))]
    """
    placements = tuple(value.placements)
    own = getattr(value, "device_mesh", None)
    spans: tuple[tuple[int, ...], ...]
    if own is None:
        own, spans = mesh, tuple((d,) for d in range(mesh.ndim))
    else:
        spans = mesh_axes(own, mesh)
    if len(placements) != own.ndim:
        raise ValueError(f"{len(placements)} placements {placements} for its "
                         f"{own.ndim}-D mesh")
    names = dim_names(own)
    return [Placed(names[d], int(own.size(d)), spans[d], p) for d, p in enumerate(placements)]


def placement_problems(named: Mapping[str, Any], mesh: Any) -> list[str]:
    """One problem per DTensor whose mesh is not part of the cell's ``mesh`` (or whose
    placements do not fit its mesh): no check can say which ranks must agree on it.

    Non-DTensors are ignored: ``placement_problems({"x": torch.zeros(2), "n": 3}, mesh)``
    is ``[]``. A DTensor over all 4 ranks of a world whose cell uses ranks 0 and 1 gives
    ``["x: a DTensor on a mesh not part of the cell's mesh: its ranks [2, 3] are outside
    the cell's mesh [[0, 1]]"]``.
    """
    problems = []
    for name, value in named.items():
        if not is_dtensor(value):
            continue
        try:
            placed(value, mesh)
        except ValueError as exc:
            problems.append(f"{name}: a DTensor on a mesh {_IN_THE_CELL}: {exc}")
    return problems


def identical_dims(value: Any, mesh: Any) -> list[int]:
    """The cell-mesh dims (of size > 1) over which ``value``'s local data must be bitwise
    identical; ``ValueError`` as :func:`placed`.

    A plain tensor: every one. A DTensor: every one that no ``Shard``/``Partial`` placement
    of its own mesh runs along, so ``Replicate`` over a sub-mesh axis means identical over
    that axis, and a cell axis its mesh does not span is implicitly replicated.

    A weight of ``ColwiseParallel`` on ``mesh["cp1"]`` of a 2x2 cell (``Shard(0)`` over
    cp1) must be identical over cp0 only: ``[0]``; its input, a plain tensor, over both:

    >>> from types import SimpleNamespace
    >>> cell = SimpleNamespace(ndim=2, size=lambda d: (2, 2)[d])
    >>> identical_dims(torch.zeros(1), cell)
    [0, 1]
    """
    differs: set[int] = set()
    if is_dtensor(value):
        for axis in placed(value, mesh):
            if not axis.placement.is_replicate():
                differs.update(axis.cell_dims)
    return [d for d in range(mesh.ndim) if mesh.size(d) > 1 and d not in differs]


# --------------------------------------------------------------------------------------
# sharding active


def sharding_problems(named: Mapping[str, Any], mesh: MeshLike) -> CheckOutcome:
    """Every ``Shard(d)`` over a mesh axis of size > 1 must give ``local[d] < global[d]``,
    and at least one tensor must be sharded over such an axis. Skipped on a 1x1 mesh.

    ``named`` holds whatever shows the parallel path is active: sharded inputs, outputs,
    parameters (tensor parallel, FSDP), buffers or activations. Each DTensor is judged on
    its own mesh (a sub-mesh such as ``mesh["cp1"]``, a flattened one, the cell's): its
    axes are named as on that mesh. One that is not part of the cell's mesh is left to
    :func:`placement_problems`. ``summary`` says which values were split over which axes.

    Only local and global shapes are read, so this needs no collective: every rank judges
    its own shard, and ``check_parity`` merges the ranks' problems.

    >>> from types import SimpleNamespace
    >>> mesh = SimpleNamespace(shape=(1, 2), ndim=2, mesh_dim_names=("cp0", "cp1"),
    ...                        size=lambda d: (1, 2)[d])
    >>> sharding_problems({"x": torch.zeros(4)}, mesh).problems[0][:58]
    'mesh (1, 2) has an axis > 1 but nothing is sharded over it'
    """
    out = CheckOutcome()
    if mesh_is_trivial(mesh):
        out.skipped = "1x1 mesh: local == global by design"
        return out
    split: dict[str, list[str]] = {}
    for name, value in named.items():
        if not is_dtensor(value):
            continue  # a plain tensor among the values: the others still count
        try:
            axes = placed(value, mesh)
        except ValueError:
            continue  # its mesh is not the cell's: placement_problems names it
        local_shape = tuple(value.to_local().shape)
        global_shape = tuple(value.shape)
        for axis in axes:
            # Shard and FSDP2's _StridedShard (not is_shard() in torch 2.13) split a tensor
            # dim; Replicate and Partial have no dim
            dim = getattr(axis.placement, "dim", None)
            if dim is None or axis.size == 1:
                continue
            if local_shape[dim] < global_shape[dim]:  # one evidence line per real split
                split.setdefault(name, []).append(axis.name)
                out.lines.append(
                    f"{name}: local {local_shape} < global {global_shape} "
                    f"on dim {dim} over {axis.name}"
                )
            else:  # a Shard that splits nothing: this rank holds the whole tensor
                out.problems.append(
                    f"{name}: Shard({dim}) over {axis.name} (size {axis.size}) "
                    f"but local shape {local_shape} == global {global_shape} on dim {dim}"
                )
    if not out.lines and not out.problems:
        out.problems.append(
            f"mesh {tuple(mesh.shape)} has an axis > 1 but nothing is sharded over it: "
            f"no input, output, parameter, buffer or declared activation has a Shard "
            f"placement over {dim_names(mesh)} (the parallel path would run as serial code)"
        )
    out.summary = "; ".join(f"{name} over {'+'.join(axes)}" for name, axes in split.items())
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
    means everywhere); a DTensor's local data over every axis > 1 that no ``Shard`` or
    ``Partial`` placement of its own mesh runs along (:func:`identical_dims`). Non-tensors,
    and DTensors on a mesh not part of the cell's (:func:`placement_problems`), are ignored.

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
        try:
            dims = identical_dims(value, mesh)
        except ValueError:
            continue  # its mesh is not the cell's: placement_problems names it
        local: torch.Tensor = value.to_local() if is_dtensor(value) else value  # type: ignore[attr-defined]
        for mesh_dim in dims:
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
        if not isinstance(grad, torch.Tensor):
            out.problems.append(f"{name}: a {type(grad).__name__}, not a tensor")
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
