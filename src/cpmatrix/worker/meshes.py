"""The meshes and groups a rank keeps between cells, and how they are let go (in the ranks).

A rank caches each cell's ``DeviceMesh`` by shape while every cell on it passed and left
its groups clean (:mod:`cpmatrix.worker.hygiene`); these helpers destroy a mesh's groups,
any group by name, and DTensor's caches that would otherwise still resolve destroyed
groups. Imports only the standard library at import time; torch inside the functions.

Example (inside the worker)::

    destroy_mesh(mesh)          # its dimension groups (never the default group)
    clear_dtensor_caches()      # a mesh of the same shape would hit stale entries
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from cpmatrix.cell import MESH_DIMS

__all__ = ["clear_dtensor_caches", "destroy_groups", "destroy_mesh", "mesh_group_names"]


def clear_dtensor_caches() -> None:
    """Forget DTensor's sharding and redistribution caches.

    DeviceMeshes of the same shape compare equal, so without this a cell's fresh mesh
    would hit cache entries holding the previous cell's (destroyed) groups:
    "Could not resolve the process group registered under the name 1". The caches
    are private, so each is cleared best-effort; a missing one is skipped.
    """
    import torch

    def attempt(fn: Any) -> None:
        try:
            fn()
        except Exception:
            pass

    attempt(lambda: torch._C._clear_DTensor_sharding_propagator_cache())
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import _redistribute as redistribute
    except ImportError:
        return
    prop: Any = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    attempt(lambda: prop.propagate_op_sharding.cache_clear())
    attempt(lambda: prop._propagate_tensor_meta_cached.cache_clear())
    attempt(lambda: redistribute._gen_transform_infos.cache_clear())
    attempt(lambda: redistribute.clear_redistribute_planner_cache())


def mesh_group_names(mesh: Any) -> set[str]:
    """The names of a mesh's dimension groups (those it can still resolve)."""
    names = set()
    for dim in MESH_DIMS:
        try:
            names.add(str(mesh.get_group(dim).group_name))
        except Exception:  # the mesh never finished building, or a group is gone
            continue
    return names


def destroy_mesh(mesh: Any) -> None:
    """Destroy a mesh's dimension groups (never the default group)."""
    import torch.distributed as dist

    for dim in MESH_DIMS:
        try:
            group = mesh.get_group(dim)
        except Exception:  # the mesh never finished building, or the group is gone
            continue
        if group is not None and group is not dist.group.WORLD:
            _destroy(group, dim)


def destroy_groups(names: Iterable[str]) -> None:
    """Destroy the live groups named ``names`` (never the default group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    world: Any = dist.distributed_c10d._world
    wanted = set(names)
    for group, name in list(world.pg_names.items()):
        if str(name) in wanted and group is not dist.group.WORLD:
            _destroy(group, str(name))


def _destroy(group: Any, label: str) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(group)
    except Exception as exc:  # never let cleanup mask the cell's own outcome
        print(f"cpmatrix worker: destroying group {label} failed: {exc!r}", file=sys.stderr)
