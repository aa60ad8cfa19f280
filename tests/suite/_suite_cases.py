"""The suite's hand-written checks (``_suite_checks``) as cpmatrix cases, run by the product.

``tests/resources/suite_checks.yaml`` names them; ``cpmatrix run`` runs them in its own
batched worlds (one per mesh shape), with everything a user's case gets: a fresh process
state per cell, RNGs seeded from the cell id, exact crash attribution. The checks are a
second opinion on the reference suite, written without the parity toolkit.

A check never raises on a numerical mismatch: it records it in :class:`Rec`; the case
gathers every rank's records over the cell's mesh and fails (on every rank alike) when any
rank recorded a failure, so no rank is left waiting in a collective.

Example (the matrix names a case and its ``check`` param)::

    - {name: suite_check, case: "_suite_cases:suite_check", level: layer,
       axes: {mesh: [2x2]}, params: {check: [layer_norm]}}
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

import torch
import torch.distributed as dist


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
    #: a group over the cell's ranks (None on one rank): the world may hold more
    group: Any = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.mesh.size(0), self.mesh.size(1)

    def randn(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=dtype or self.dtype)

    def mask(self, *shape: int, frac: float = 0.25) -> torch.Tensor:
        return torch.rand(*shape, generator=self.gen) >= frac


#: mesh -> n, the base size of its checks (pair N; sequences use n+1, n+2): 2x2 pads (N=5),
#: 2x3 leaves one column shard and one sequence shard a single real element, others none.
MESH_N: dict[str, int] = {"1x1": 5, "1x2": 6, "2x2": 5, "2x3": 9}

#: mutant -> the check that must kill it (on 2x2)
MUTANT_CHECKS: dict[str, str] = {
    "shard_offset_off_by_one": "layer_norm",
    "no_grad_allreduce": "layer_norm",
    "allgather_bwd_no_reduce": "all_gather",
    "reduce_scatter_no_sum": "reduce_scatter",
    "transpose_view_not_permute": "transpose",
    "ring_skip_last_step": "ring_attention",
    "lse_merge_sign": "ring_attention",
    "ring_no_dkv_return": "ring_attention",
    "pad_mask_off": "ring_attention",
    "tri_mask_off": "triangle_outgoing",
    "loss_double_count": "train_step",
}


def _run_check(cell: Any, check: str, mutant: str | None) -> list[tuple[list[str], list[str]]]:
    """Run ``check_<check>`` on this rank; every rank's (lines, failures), in mesh order."""
    from _suite_checks import CHECKS

    from cpmatrix.suite.mutants import planted

    if check not in CHECKS:
        raise ValueError(f"unknown check {check!r}; known: {sorted(CHECKS)}")
    # an autocast cell is mixed precision: fp32 weights, forwards under bf16 autocast
    dtype = torch.float32 if cell.autocast else cell.dtype
    params: dict[str, Any] = {"n": MESH_N[f"{cell.mesh.size(0)}x{cell.mesh.size(1)}"],
                              "path": cell.path, "autocast": cell.autocast}
    # over the cell's mesh only: the world may hold more ranks than this cell
    group = cell.mesh._flatten().get_group() if cell.world_size > 1 else None
    rec = Rec()
    ctx = Ctx(cell.mesh, cell.rank, cell.world_size, dtype, cell.generator, rec, params, group)
    fn: Callable[[Ctx], None] = getattr(import_module("_suite_checks"), f"check_{check}")
    try:
        with planted(mutant):
            fn(ctx)
    except Exception:  # symmetric code: every rank raises the same way
        rec.failures.append("raised: " + traceback.format_exc(limit=6))
    gathered: list[Any] = [None] * cell.world_size
    if group is None:
        gathered[0] = (rec.lines, rec.failures)
    else:
        dist.all_gather_object(gathered, (rec.lines, rec.failures), group=group)
    return gathered


def suite_check(cell: Any) -> None:
    """Pass when ``check_<cell.params["check"]>`` recorded no failure on any rank."""
    gathered = _run_check(cell, cell.params["check"], None)
    cell.record("checks", "; ".join(gathered[0][0]))
    failures = [f"rank {r}: {msg}" for r, (_, fs) in enumerate(gathered) for msg in fs]
    if failures:
        raise AssertionError("\n".join(failures))


def suite_mutant_killed(cell: Any) -> None:
    """Pass when the planted ``cell.params["plant"]`` makes its check fail by a mismatch.

    A negative control: the mutant must be *killed*, and by a numerical check, not by a
    crash the bug happened to cause.
    """
    plant = cell.params["plant"]
    check = MUTANT_CHECKS[plant]
    gathered = _run_check(cell, check, plant)
    failures = [f for _, fs in gathered for f in fs]
    if not failures:
        raise AssertionError(f"mutant {plant} survived check {check}")
    numeric = [f for f in failures if not f.startswith("raised:")]
    if not numeric:
        raise AssertionError(f"mutant {plant} only crashed check {check}:\n{failures[0]}")
    cell.record("killed_by", f"{check}: {numeric[0][:200]}")
