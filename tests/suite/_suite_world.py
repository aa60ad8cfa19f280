"""Run batches of checks inside real multi-rank gloo worlds (helpers for the suite tests).

One world per mesh shape runs many checks: starting a world costs seconds on these
machines, a check a fraction of one. A check never raises on a numerical mismatch: it
records it in :class:`Rec`, and the worker all-gathers every rank's records after each
check, so all ranks agree on the verdict and none is left waiting in a collective
(a rank that raised would leave the others hanging).
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import socket
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass
class Rec:
    """Evidence and failures of one check on one rank."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def close(self, what: str, actual: torch.Tensor, expected: torch.Tensor, **tol: Any) -> None:
        """``assert_close`` (default tolerances unless given), recorded instead of raised."""
        actual, expected = actual.detach(), expected.detach()
        diff = (actual.double() - expected.double()).abs()
        worst = float(diff.max()) if diff.numel() else 0.0
        try:
            torch.testing.assert_close(actual, expected, **tol)
        except AssertionError as e:
            self.failures.append(f"{what}: {str(e).splitlines()[0]} (max abs {worst:.3e})")
            return
        self.lines.append(f"{what}: max_abs={worst:.2e}")

    def true(self, what: str, cond: bool, detail: str = "") -> None:
        if cond:
            self.lines.append(f"{what}: ok")
        else:
            self.failures.append(f"{what}: FAILED {detail}")


@dataclass
class Ctx:
    """What a check receives: the mesh, a shared generator, the dtype and a recorder."""

    mesh: Any
    rank: int
    world: int
    dtype: torch.dtype
    gen: torch.Generator
    rec: Rec
    params: dict[str, Any]

    @property
    def shape(self) -> tuple[int, int]:
        return self.mesh.size(0), self.mesh.size(1)

    def randn(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=dtype or self.dtype)

    def mask(self, *shape: int, frac: float = 0.25) -> torch.Tensor:
        return torch.rand(*shape, generator=self.gen) >= frac


@dataclass(frozen=True)
class Job:
    """One check to run: ``module:function``, a label, the mutant to plant, params."""

    label: str
    target: str
    mutant: str | None = None
    dtype: str = "float64"
    params: tuple[tuple[str, Any], ...] = ()


def _run_jobs(rank: int, world: int, shape: tuple[int, int], port: int, jobs: list[Job],
              out_path: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)  # 2 cores, up to 6 ranks: threads only fight each other
    from torch.distributed.device_mesh import init_device_mesh

    from cpmatrix.suite.mutants import planted

    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=90))
    try:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("cp0", "cp1"))
        results: dict[str, Any] = {}
        for job in jobs:
            rec = Rec()
            mod, fn_name = job.target.split(":")
            fn: Callable[[Ctx], None] = getattr(importlib.import_module(mod), fn_name)
            # the same stream on every rank: a check's full tensors agree everywhere
            seed = zlib.crc32(job.label.encode())
            gen = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)  # module inits draw from the global RNG: same on all ranks
            ctx = Ctx(mesh, rank, world, getattr(torch, job.dtype), gen, rec, dict(job.params))
            t0 = time.perf_counter()
            try:
                with planted(job.mutant):
                    fn(ctx)
            except Exception:  # symmetric code: every rank raises the same way
                rec.failures.append("raised: " + traceback.format_exc(limit=6))
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, (rec.lines, rec.failures))
            if rank == 0:
                results[job.label] = {
                    "ok": not any(f for _, f in gathered),
                    "seconds": round(time.perf_counter() - t0, 3),
                    "lines": gathered[0][0],
                    "failures": [f"rank {r}: {msg}" for r, (_, fs) in enumerate(gathered)
                                 for msg in fs],
                }
        if rank == 0:
            Path(out_path).write_text(json.dumps(results, indent=1))
        dist.barrier()  # nobody tears down while a peer still talks to the store on rank 0
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(shape: tuple[int, int], jobs: list[Job], out_path: Path,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Spawn ``R*C`` gloo ranks, run ``jobs`` on an ``R x C`` mesh, return rank 0's results."""
    world = shape[0] * shape[1]
    try:
        mp.start_processes(_run_jobs, args=(world, shape, free_port(), jobs, str(out_path),
                                            env or {}),
                           nprocs=world, join=True, start_method="spawn")
    except mp.ProcessExitedException as exc:
        # gloo can abort a rank while the process group is torn down after every check
        # ran ("terminate called without an active exception" when rank 0, which hosts
        # the store, leaves first). Rank 0 writes the results only after all the checks
        # were gathered, so with them on disk the crash touched no result.
        if not out_path.exists():
            raise
        print(f"warning: the {shape[0]}x{shape[1]} world crashed in teardown after all "
              f"checks were gathered: {exc}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result
