"""One cell's case on one rank: seed, mesh, context, the case itself, and its outcome.

Runs inside the ranks (:mod:`cpmatrix.worker.world_main` calls :func:`run_cell` for each
cell, in the cell's environment and isolation). Imports only the standard library, torch
(when a cell runs) and the worker-side part of cpmatrix.

Example (inside the worker)::

    outcome, mesh = run_cell(world, index, spec, rank, out_dir, meshes, ledger)
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from cpmatrix.cell import MESH_DIMS, TORCH_DTYPES, CellContext, seed_for
from cpmatrix.worker.forks import leave_if_child
from cpmatrix.worker.hygiene import GroupLedger
from cpmatrix.worker.protocol import ERROR, OK, CellSpec, Outcome, WorldSpec

__all__ = ["CaseModuleMismatch", "run_cell"]


def _reseed(seed: int) -> None:
    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is optional for cases
        pass
    torch.manual_seed(seed)  # also seeds every CUDA device


class CaseModuleMismatch(ImportError):
    """The case module was imported from another file than the one the digest covers."""

    check = "case_module"


def _import_case(ref: str, expected_file: str) -> tuple[Any, str]:
    """The case function and the real path of the file its module was loaded from."""
    module_name, _, attr = ref.partition(":")
    module = importlib.import_module(module_name)
    ran = os.path.realpath(getattr(module, "__file__", None) or "")
    if expected_file and ran != os.path.realpath(expected_file):
        raise CaseModuleMismatch(
            f"case {ref!r}: module {module_name!r} was imported from {ran or 'nowhere'}, but "
            f"the cell's digest covers {expected_file}: another module of that name comes "
            "first on the path (the run refuses to report a verdict for other code)")
    try:
        return getattr(module, attr), ran
    except AttributeError:
        raise AttributeError(f"case {ref!r}: module {module_name!r} has no {attr!r}") from None


def run_cell(
    world: WorldSpec, index: int, spec: CellSpec, rank: int, out_dir: Path,
    meshes: dict[tuple[int, int], Any] | None = None,
    ledger: GroupLedger | None = None,
) -> tuple[Outcome, Any]:
    """Run one cell on this rank; return its outcome and its mesh (never raises).

    ``out_dir`` is the cell's folder on this rank (the case's ``ctx.out_dir``), made by
    the caller, which points its stack dumps there.

    The mesh's groups are NOT destroyed here: a rank that is done must not tear down
    a group a peer is still waiting in (that would turn a peer's hang into a
    misleading "connection closed" error). The caller destroys them after the
    cross-rank barrier. ``ledger`` is armed right before the case runs (the groups the
    cell's own mesh brought are the cell's to use, not the case's to make).

    Only this process returns from here: a child the case forked that comes back out of
    the case ends inside (:func:`cpmatrix.worker.forks.leave_if_child`).
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    seed = seed_for(spec.id, spec.run_number)
    started = time.time()
    failure: dict[str, str] = {}
    ctx: CellContext | None = None
    mesh = None
    setup_s = case_s = 0.0
    owner = os.getpid()
    if ledger is not None:
        ledger.disarm()
    try:
        _reseed(seed)
        if world.device == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        shape = (spec.rows, spec.cols)
        mesh = (meshes or {}).get(shape)
        if mesh is None:
            mesh = init_device_mesh(world.device, shape, mesh_dim_names=MESH_DIMS)
        setup_s = time.time() - started
        case, case_file = _import_case(spec.case, spec.case_file)
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)
        ctx = CellContext.from_spec(
            spec, rank=rank, mesh=mesh, device=device, backend=world.backend,
            dtype=getattr(torch, TORCH_DTYPES[spec.dtype]), seed=seed, generator=generator,
            out_dir=out_dir)
        ctx.record("case_file", case_file)  # which file ran: the one the digest covers
        if ledger is not None:
            ledger.before_case()
        t0 = time.perf_counter()
        try:
            case(ctx)
        except BaseException as exc:
            leave_if_child(owner, world.dir, index, rank, exc)
            raise
        finally:
            case_s = time.perf_counter() - t0
        leave_if_child(owner, world.dir, index, rank, None)
    except BaseException as exc:  # a case may raise anything; SystemExit too is a failure
        if isinstance(exc, KeyboardInterrupt):
            raise
        failure = {"exc_type": type(exc).__name__, "message": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(),
                   "check": str(getattr(exc, "check", "") or "")}
        # Print it too: the rank's log is the first place people look.
        print(f"cpmatrix worker: cell {spec.id} failed on rank {rank}:\n"
              f"{failure['traceback']}", file=sys.stderr)
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    outcome = Outcome(
        index=index, rank=rank, id=spec.id, run=world.run_id,
        status=ERROR if failure else OK, exc_type=failure.get("exc_type", ""),
        message=failure.get("message", ""), traceback=failure.get("traceback", ""),
        check=failure.get("check", ""), evidence=dict(ctx.evidence) if ctx is not None else {},
        setup_s=setup_s, case_s=case_s, duration_s=time.time() - started,
    )
    return outcome, mesh
