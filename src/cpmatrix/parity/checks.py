"""The anti-vacuous checks on a live mesh: each one closes a way a parity test can pass on a
broken CP path. What to compare and what it means is decided in :mod:`.verdict` (pure,
tested with fake meshes); this module runs the collectives that gather it.

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
from typing import Any

import torch
import torch.distributed as dist

from cpmatrix.parity.errors import ReplicationError, VacuousError, odd_input_fails
from cpmatrix.parity.trees import to_full
from cpmatrix.parity.verdict import (
    CheckOutcome,
    grad_verdict,
    is_dtensor,
    mesh_is_trivial,
    meta_problems,
    pack,
    placement_problems,
    replica_groups,
    replica_meta,
    replica_problems,
    sharding_problems,
)

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
    "placement_problems",
    "replicated_problems",
    "sharding_problems",
]


def assert_sharding_active(named: Mapping[str, Any], mesh: Any) -> CheckOutcome:
    """Raise :class:`VacuousError` (check ``sharding_active``) unless sharding is active.

    ``named`` may hold inputs, outputs, parameters, buffers or activations, each a DTensor
    on the cell's mesh or on a mesh derived from it (``mesh["cp1"]``, a flattened one); a
    DTensor on a mesh that is not part of ``mesh`` fails the check. Example::

        assert_sharding_active({"x": distribute_tensor(x, cell.mesh, [Shard(0), Shard(0)]),
                                "up.weight": tp_model.up.weight}, cell.mesh)
    """
    with odd_input_fails("sharding_active"):
        out = sharding_problems(named, mesh)
        out.problems[:0] = placement_problems(named, mesh)
    if out.problems:
        raise VacuousError("sharding_active", "sharding_active: " + "; ".join(out.problems))
    return out


# --------------------------------------------------------------------------------------
# replicated identical


def gather_object_over_mesh(obj: Any, mesh: Any) -> list[Any]:
    """``obj`` from every rank of ``mesh`` (row-major mesh order), using only mesh groups.

    Gathers along the last mesh dim, then gathers those lists along the others. Only the
    mesh's own groups are used, never the world group: the runtime destroys a cell's groups
    after it, so a collective left half-done by one cell cannot be matched by the next.
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


def replicated_problems(named: Mapping[str, Any], mesh: Any) -> CheckOutcome:
    """Gather every named value over the ranks that must hold the same data; compare exactly.

    A plain tensor must be identical on the whole world; a DTensor's local data on every
    cell-mesh axis that no ``Shard``/``Partial`` placement of its own mesh runs along
    (:func:`.verdict.replica_groups`), whatever mesh derived from the cell's it lives on.
    Bitwise: a replica "close enough" already drifted. All ranks gather the same data and
    so reach the same verdict (no rank raises alone).
    """
    out = CheckOutcome()
    with odd_input_fails("replicated_identical"):
        groups = replica_groups(named, mesh)
    for group in groups:  # sorted by axis name on every rank: the collectives line up
        handle = mesh.get_group(group.mesh_dim)
        ranks = dist.get_process_group_ranks(handle)
        metas: list[Any] = [None] * len(ranks)
        dist.all_gather_object(metas, replica_meta(group.tensors), group=handle)
        problems = meta_problems(group, ranks, metas)
        if not problems:  # equal metas: every rank's buffer has this rank's size
            flat = pack(group.tensors)
            gathered = [torch.empty_like(flat) for _ in ranks]
            dist.all_gather(gathered, flat, group=handle)
            problems = replica_problems(group, ranks, gathered)
        out.problems.extend(problems)
        if not out.problems:
            out.lines.append(f"{len(group.tensors)} tensors bitwise identical over {group.label}")
    if not groups:
        out.skipped = ("nothing here is replicated over more than one rank (a 1-rank mesh, "
                       "or every value sharded): nothing to compare across ranks")
    return out


def assert_replicated_identical(named: Mapping[str, Any], mesh: Any) -> CheckOutcome:
    """Raise :class:`ReplicationError` if a replicated value differs across ranks.

    Call it on every rank (it gathers). A DTensor on a mesh that is not part of ``mesh``
    fails the check. Example::

        assert_replicated_identical({"loss": loss, "w": model.weight}, cell.mesh)
    """
    with odd_input_fails("replicated_identical"):
        foreign = placement_problems(named, mesh)
    out = replicated_problems(named, mesh)
    out.problems[:0] = foreign
    if out.problems:
        msg = "replicated_identical: " + "; ".join(out.problems)
        raise ReplicationError("replicated_identical", msg)
    return out


# --------------------------------------------------------------------------------------
# grads non-zero and finite


def grad_problems(
    named: Mapping[str, Any], *, allow_zero: Mapping[str, str] | None = None
) -> CheckOutcome:
    """Each grad present, finite and not all zero (``allow_zero[name] = reason`` exempts one).

    A DTensor grad is judged by its global value (a shard may legitimately be all zero: a
    pad-only shard). Every rank reassembles every DTensor grad in the same order, so the
    collectives of ``full_tensor()`` line up.
    """
    with odd_input_fails("nonzero"):
        names = list(named.items())
    full = {name: to_full(grad) for name, grad in names}  # None stays None
    with odd_input_fails("nonzero"):
        return grad_verdict(full, allow_zero=allow_zero)


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
    with torch.no_grad(), odd_input_fails("nonzero"):
        for name, p in module.named_parameters():
            if p.numel() == 0 or is_dtensor(p):
                continue
            flat = p.detach().reshape(-1)
            # one element is trivially "all equal": only zero makes it vacuous
            degenerate = bool(flat[0] == 0) if p.numel() == 1 else bool((flat[1:] == flat[0]).all())
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
