"""The anti-vacuous checks: each one closes a way a parity test can pass on a broken CP path.

- :func:`sharding_problems` - on a mesh with an axis > 1 something must really be sharded
  (``local.shape[d] < global.shape[d]``), else CP code runs as serial code and proves nothing.
- :func:`replicated_problems` - a value meant to be replicated is gathered from every rank
  and compared *exactly*: a missing broadcast/all-reduce shows up as ranks that disagree.
- :func:`grad_problems` - grads must exist, be finite and not all zero (``0 == 0`` passes).
- :func:`perturb_degenerate_` - zero- or constant-initialised parameters (a final projection
  at zero, a LayerNorm weight of ones) get random values, so outputs and grads are live.

The ``*_problems`` functions return messages instead of raising so :func:`check_parity`
can report every failure at once; ``assert_*`` wrappers raise for direct use in a case.

Example (inside a case, on every rank)::

    from cpmatrix.parity import assert_replicated_identical, assert_sharding_active
    assert_sharding_active({"x": x_dtensor}, cell.mesh)
    assert_replicated_identical({"loss": loss, "weight": model.weight}, cell.mesh)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cpmatrix.parity.errors import ReplicationError, VacuousError

__all__ = [
    "CheckOutcome",
    "assert_grads_nonzero_finite",
    "assert_replicated_identical",
    "assert_sharding_active",
    "gather_object_over_mesh",
    "grad_problems",
    "is_dtensor",
    "mesh_is_trivial",
    "perturb_degenerate_",
    "replicated_problems",
    "sharding_problems",
]


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
    """True for a ``torch.distributed.tensor.DTensor`` (checked without importing it eagerly)."""
    return (
        isinstance(value, torch.Tensor)
        and hasattr(value, "placements")
        and hasattr(value, "to_local")
    )


def mesh_is_trivial(mesh: Any) -> bool:
    """A 1x1 mesh: every collective is a no-op and local == global, by design."""
    return all(int(s) == 1 for s in mesh.shape)


def _dim_names(mesh: Any) -> tuple[str, ...]:
    names = getattr(mesh, "mesh_dim_names", None)
    return tuple(names) if names else tuple(f"dim{i}" for i in range(mesh.ndim))


# --------------------------------------------------------------------------------------
# sharding active


def sharding_problems(named: Mapping[str, Any], mesh: Any) -> CheckOutcome:
    """Every ``Shard(d)`` over a mesh axis of size > 1 must give ``local[d] < global[d]``,
    and at least one tensor must be sharded over such an axis. Skipped on a 1x1 mesh."""
    out = CheckOutcome()
    if mesh_is_trivial(mesh):
        out.skipped = "1x1 mesh: local == global by design"
        return out
    names = _dim_names(mesh)
    active = 0
    for name, value in named.items():
        if not is_dtensor(value):
            continue
        local_shape = tuple(value.to_local().shape)
        global_shape = tuple(value.shape)
        for mesh_dim, placement in enumerate(value.placements):
            dim = getattr(placement, "dim", None)
            if not placement.is_shard() or dim is None or mesh.size(mesh_dim) == 1:
                continue
            if local_shape[dim] < global_shape[dim]:
                active += 1
                out.lines.append(
                    f"{name}: local {local_shape} < global {global_shape} "
                    f"on dim {dim} over {names[mesh_dim]}"
                )
            else:
                out.problems.append(
                    f"{name}: Shard({dim}) over {names[mesh_dim]} (size {mesh.size(mesh_dim)}) "
                    f"but local shape {local_shape} == global {global_shape} on dim {dim}"
                )
    if active == 0 and not out.problems:
        out.problems.append(
            f"mesh {tuple(mesh.shape)} has an axis > 1 but no input is sharded over it: "
            f"declare Shard placements over {names} (the CP path would run as serial code)"
        )
    return out


def assert_sharding_active(named: Mapping[str, Any], mesh: Any) -> CheckOutcome:
    """Raise :class:`VacuousError` (check ``sharding_active``) unless sharding is active.

    Example::

        assert_sharding_active({"x": distribute_tensor(x, cell.mesh, [Shard(0), Shard(0)])},
                               cell.mesh)
    """
    out = sharding_problems(named, mesh)
    if out.problems:
        raise VacuousError("sharding_active", "sharding_active: " + "; ".join(out.problems))
    return out


# --------------------------------------------------------------------------------------
# replicated identical


def _groups_for(value: Any, mesh: Any) -> list[tuple[str, Any]]:
    """(label, process group) pairs over which ``value``'s local data must be identical.

    Only the mesh's own groups are used, never the world group: the runtime destroys a
    cell's groups after it, so a collective left half-done by one cell cannot be matched
    by the next. A plain tensor is checked over every mesh axis, which is the whole mesh:
    equal along every row and every column means equal everywhere.
    """
    names = _dim_names(mesh)
    groups = []
    for mesh_dim in range(mesh.ndim):
        if mesh.size(mesh_dim) == 1:
            continue
        if not is_dtensor(value) or value.placements[mesh_dim].is_replicate():
            groups.append((names[mesh_dim], mesh.get_group(mesh_dim)))
    return groups


def gather_object_over_mesh(obj: Any, mesh: Any) -> list[Any]:
    """``obj`` from every rank of ``mesh`` (row-major mesh order), using only mesh groups.

    Gathers along the last mesh dim, then gathers those lists along the others.
    """
    gathered: list[Any] = [obj]
    for mesh_dim in reversed(range(mesh.ndim)):
        size = mesh.size(mesh_dim)
        if size == 1:
            continue
        parts: list[Any] = [None] * size
        dist.all_gather_object(parts, gathered, group=mesh.get_group(mesh_dim))
        gathered = [item for part in parts for item in part]
    return gathered


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def replicated_problems(named: Mapping[str, Any], mesh: Any) -> CheckOutcome:
    """Gather every named value over the ranks that must hold the same data; compare exactly.

    A plain tensor must be identical on the whole world; a DTensor's local data on every
    mesh axis where it is ``Replicate``. Bitwise: a replica "close enough" already drifted.
    All ranks gather the same data and so reach the same verdict (no rank raises alone).
    """
    out = CheckOutcome()
    by_group: dict[str, tuple[Any, dict[str, torch.Tensor]]] = {}
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            continue
        local: torch.Tensor = value.to_local() if is_dtensor(value) else value  # type: ignore[attr-defined]
        for label, group in _groups_for(value, mesh):
            by_group.setdefault(label, (group, {}))[1][name] = local
    for label in sorted(by_group):  # same order on every rank: collectives must line up
        group, tensors = by_group[label]
        out.problems.extend(_compare_over(label, group, tensors))
        if not out.problems:
            out.lines.append(f"{len(tensors)} tensors bitwise identical over {label}")
    if not by_group:
        out.skipped = "no replicated value spans more than one rank"
    return out


def _compare_over(label: str, group: Any, tensors: dict[str, torch.Tensor]) -> list[str]:
    size = dist.get_world_size(group)
    meta = [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors.items()]
    metas: list[Any] = [None] * size
    dist.all_gather_object(metas, meta, group=group)
    ranks = dist.get_process_group_ranks(group)
    if any(m != metas[0] for m in metas):
        return [f"over {label} (ranks {ranks}): names/shapes/dtypes differ: {metas}"]
    flat = torch.cat([_as_bytes(t) for t in tensors.values()]) if tensors else torch.empty(0)
    gathered = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(gathered, flat, group=group)
    problems = []
    offset = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        ref = gathered[0][offset : offset + nbytes]
        differing = [
            ranks[i]
            for i in range(1, size)
            if not torch.equal(gathered[i][offset : offset + nbytes], ref)
        ]
        if differing:
            worst = 0.0
            if t.is_floating_point():
                base = ref.view(t.dtype).double()
                for i in range(1, size):
                    other = gathered[i][offset : offset + nbytes].view(t.dtype).double()
                    worst = max(worst, float((other - base).abs().nan_to_num(float("inf")).max()))
            problems.append(
                f"{name}: differs over {label} between rank {ranks[0]} and ranks "
                f"{differing} (max abs {worst:.3g}; a missing all-reduce/broadcast?)"
            )
        offset += nbytes
    return problems


def assert_replicated_identical(named: Mapping[str, Any], mesh: Any) -> CheckOutcome:
    """Raise :class:`ReplicationError` if a replicated value differs across ranks.

    Call it on every rank (it gathers). Example::

        assert_replicated_identical({"loss": loss, "w": model.weight}, cell.mesh)
    """
    out = replicated_problems(named, mesh)
    if out.problems:
        msg = "replicated_identical: " + "; ".join(out.problems)
        raise ReplicationError("replicated_identical", msg)
    return out


# --------------------------------------------------------------------------------------
# grads non-zero and finite


def grad_problems(
    named: Mapping[str, Any], *, allow_zero: Mapping[str, str] | None = None
) -> CheckOutcome:
    """Each grad present, finite and not all zero (``allow_zero[name] = reason`` exempts one)."""
    out = CheckOutcome()
    allow_zero = allow_zero or {}
    for name, grad in named.items():
        if grad is None:
            out.problems.append(f"{name}: no gradient (not connected to the output?)")
            continue
        # The global value: a shard may legitimately be all zero (a pad-only shard). Every
        # rank reassembles every DTensor grad in the same order, so the collectives line up.
        full = grad.full_tensor() if is_dtensor(grad) else grad
        nonfinite = int((~torch.isfinite(full)).sum()) if full.is_floating_point() else 0
        if nonfinite:
            out.problems.append(f"{name}: {nonfinite} non-finite elements")
            continue
        peak = float(full.abs().max()) if full.numel() else 0.0
        if peak > 0.0:
            out.lines.append(f"{name}: max abs {peak:.3g}")
        elif name in allow_zero:
            out.lines.append(f"{name}: all zero, allowed: {allow_zero[name]}")
        else:
            out.problems.append(f"{name}: all zero (vacuous: 0 == 0 passes)")
    return out


def assert_grads_nonzero_finite(
    named: Mapping[str, Any], *, allow_zero: Mapping[str, str] | None = None
) -> CheckOutcome:
    """Raise :class:`VacuousError` (check ``nonzero``) on a missing, zero or non-finite grad.

    Example::

        assert_grads_nonzero_finite({n: p.grad for n, p in model.named_parameters()})
    """
    out = grad_problems(named, allow_zero=allow_zero)
    if out.problems:
        raise VacuousError("nonzero", "nonzero: " + "; ".join(out.problems))
    return out


# --------------------------------------------------------------------------------------
# zero-init perturbation


def perturb_degenerate_(module: torch.nn.Module, generator: torch.Generator) -> list[str]:
    """Add random noise to every parameter whose elements are all equal; return their names.

    Zero-init output projections (AlphaFold-style "final" layers) make the output and all
    upstream grads zero, and constant weights (LayerNorm at 1) hide permutation bugs.
    Noise has std ``1/sqrt(fan_in)`` (matrices) or 0.5 (vectors), drawn in float64 from
    ``generator`` - identical on every rank - then cast to the parameter's dtype.

    Example::

        >>> import torch
        >>> lin = torch.nn.Linear(4, 4); _ = torch.nn.init.zeros_(lin.weight)
        >>> perturb_degenerate_(lin, torch.Generator().manual_seed(0))
        ['weight']
        >>> bool(lin.weight.abs().max() > 0)
        True
    """
    changed = []
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.numel() == 0 or is_dtensor(p):
                continue
            flat = p.detach().reshape(-1)
            degenerate = (
                bool((flat == 0).all()) if p.numel() == 1 else bool((flat == flat[0]).all())
            )
            if not degenerate:
                continue
            fan_in = p.shape[1:].numel() if p.ndim >= 2 else 0
            std = 1.0 / math.sqrt(fan_in) if fan_in else 0.5
            noise = torch.randn(
                p.shape, generator=generator, dtype=torch.float64, device=generator.device
            )
            p.add_((noise * std).to(p.device, p.dtype))
            changed.append(name)
    return changed
