"""The verdict of :func:`check_parity`: per-check problems, agreed by every rank, evidence.

Private: cases use :mod:`cpmatrix.parity`'s public names only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cpmatrix.parity.checks import (
    CheckOutcome,
    gather_object_over_mesh,
    placement_problems,
    replicated_problems,
    sharding_problems,
)
from cpmatrix.parity.compare import POOL_BELOW, Diff, compare_named, format_diffs
from cpmatrix.parity.errors import (
    CHECKS,
    Check,
    MismatchError,
    ParityError,
    ReplicationError,
    VacuousError,
    odd_input_fails,
)
from cpmatrix.parity.flips import resolution_line
from cpmatrix.parity.tolerance import Tolerance

__all__ = [
    "ParityReport",
    "Verdicts",
    "agree",
    "check_buffers",
    "check_param_grads",
    "emit",
    "finish",
    "mesh_sizes",
]


def mesh_sizes(mesh: Any) -> dict[str, int]:
    """The mesh's axis sizes by name (``{"cp0": 2, "cp1": 2}``)."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or
                  (f"dim{i}" for i in range(mesh.ndim)))
    return {name: int(mesh.size(i)) for i, name in enumerate(names)}

_ERROR_FOR: dict[str, type[ParityError]] = {
    Check.REPLICATED_IDENTICAL: ReplicationError,
    Check.SHARDING_ACTIVE: VacuousError,
    Check.NONZERO: VacuousError,
    Check.OUTPUT: MismatchError,
    Check.INPUT_GRAD: MismatchError,
    Check.PARAM_GRAD: MismatchError,
    Check.BUFFER: MismatchError,
    Check.LOSS: MismatchError,
    Check.WEIGHT_DELTA: MismatchError,
}


@dataclass(frozen=True, slots=True)
class ParityReport:
    """What a passing :func:`check_parity` measured (also recorded via ``cell.record``)."""

    label: str
    tolerance: Tolerance
    diffs: tuple[Diff, ...]
    checks: dict[str, str] = field(default_factory=dict)
    perturbed: tuple[str, ...] = ()

    @property
    def max_abs(self) -> float:
        return max((d.max_abs for d in self.diffs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((d.max_rel for d in self.diffs), default=0.0)


@dataclass(slots=True)
class Verdicts:
    """Per-check problems and evidence lines, collected on one rank."""

    label: str
    problems: dict[str, list[str]] = field(default_factory=dict)
    lines: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    diffs: list[Diff] = field(default_factory=list)
    #: The check that compared each of ``diffs``, in the same order: a parameter's name is
    #: both a grad and a weight delta in a training check, the evidence says which.
    checks_of: list[str] = field(default_factory=list)
    #: Extra evidence (``<label>.<key>``), e.g. which values were sharded over which axes.
    evidence: dict[str, Any] = field(default_factory=dict)
    #: The mesh's axis sizes by name: a uniform CP/serial ratio is named against them.
    sizes: dict[str, int] = field(default_factory=dict)

    def add(self, check: str, outcome: CheckOutcome) -> None:
        self.lines.setdefault(check, []).extend(outcome.lines)
        if outcome.problems:
            self.problems.setdefault(check, []).extend(outcome.problems)
        if outcome.skipped:
            self.skipped[check] = outcome.skipped

    def add_diffs(self, check: str, diffs: list[Diff], tol: Tolerance) -> None:
        self.diffs.extend(diffs)
        self.checks_of.extend(check for _ in diffs)
        bad = [d for d in diffs if not d.ok]
        if bad:
            self.problems.setdefault(check, []).append(
                format_diffs(check, diffs, tol, self.sizes))
        elif diffs:
            worst = max(diffs, key=lambda d: d.max_abs)
            self.lines.setdefault(check, []).append(
                f"{len(diffs)} tensors within tolerance, worst {worst.name}: max abs "
                f"{worst.max_abs:.3g}, max rel {worst.max_rel:.3g}"
            )
        # the elements a discrete decision flipped, pass or fail: named in the evidence
        flipped = [f"{d.name}: {d.flips.line()}" for d in diffs
                   if d.ok and d.flips is not None and d.flips.cp]
        if flipped:
            self.lines.setdefault(check, []).append("flips: " + "; ".join(flipped))

    def check_placements(self, named: Mapping[str, Any], mesh: Any) -> None:
        """Every DTensor on a mesh derived from the cell's (check ``setup``)."""
        with odd_input_fails(Check.SETUP):
            problems = placement_problems(named, mesh)
        if problems:
            self.problems.setdefault(Check.SETUP, []).extend(problems)


    def check_sharding(self, named: Mapping[str, Any], mesh: Any) -> None:
        """``sharding_active`` over every value that can show it (inputs, outputs, sharded
        parameters and buffers, declared activations); records which were split over what."""
        self.check_placements(named, mesh)
        with odd_input_fails(Check.SHARDING_ACTIVE):
            outcome = sharding_problems(named, mesh)
        self.add(Check.SHARDING_ACTIVE, outcome)
        if outcome.summary:
            self.evidence["sharded"] = outcome.summary


def check_param_grads(
    verdicts: Verdicts, serial_params: Mapping[str, torch.Tensor],
    cp_params: Mapping[str, torch.Tensor], tol: Tolerance, mesh: Any,
    twin: Mapping[str, Any] | None = None,
) -> None:
    """Every parameter grad by name against the serial one, and replicated ones identical:
    a replicated parameter whose grad misses its all-reduce fails only here."""
    twin = twin or {}
    grads = {n: p.grad for n, p in cp_params.items() if p.grad is not None}
    verdicts.check_placements({f"grad {n}": g for n, g in grads.items()}, mesh)
    verdicts.add_diffs(
        Check.PARAM_GRAD,
        compare_named({n: (cp_params[n].grad, p.grad, twin.get(n))
                       for n, p in serial_params.items()}, tol),
        tol,
    )
    verdicts.add(Check.PARAM_GRAD, replicated_problems(grads, mesh))


def check_buffers(
    verdicts: Verdicts, serial: Mapping[str, torch.Tensor], cp: Mapping[str, torch.Tensor],
    tol: Tolerance, twin: Mapping[str, Any] | None = None, when: str = "",
) -> None:
    """Every buffer by name against the serial one (a DTensor buffer through its full
    value): running statistics from local rows only, a RoPE table that lost its phase.
    Names only one side has are a problem of ``buffer`` too. ``when`` prefixes the names
    (``step 1: bn.running_mean``)."""
    twin = twin or {}
    if not serial and not cp:
        verdicts.skipped.setdefault(Check.BUFFER, "the model keeps no buffers")
        return
    missing, extra = sorted(set(serial) - set(cp)), sorted(set(cp) - set(serial))
    if missing or extra:
        verdicts.problems.setdefault(Check.BUFFER, []).append(
            f"buffers differ by name{when and ' ' + when}: only serial {missing}, "
            f"only CP {extra}")
    prefix = f"{when}: " if when else ""
    verdicts.add_diffs(
        Check.BUFFER,
        compare_named({f"{prefix}{n}": (cp[n], b, twin.get(n))
                       for n, b in serial.items() if n in cp}, tol),
        tol,
    )


def agree(problems: dict[str, list[str]], mesh: Any) -> dict[str, list[str]]:
    """Every rank's problems, merged, so every rank raises the same error (no rank raises
    alone while the others wait in a collective: seed rule 20)."""
    if not dist.is_available() or not dist.is_initialized() or mesh.size() == 1:
        return problems
    gathered = gather_object_over_mesh(problems, mesh)
    merged: dict[str, list[str]] = {}
    for check in CHECKS:
        seen: dict[str, list[int]] = {}
        for rank, rank_problems in enumerate(gathered):
            for text in rank_problems.get(check, []):
                seen.setdefault(text, []).append(rank)
        for text, ranks in seen.items():
            where = "" if len(ranks) == len(gathered) else f"[ranks {ranks}] "
            merged.setdefault(check, []).append(where + text)
    return merged


def emit(
    cell: Any, label: str, verdicts: Verdicts, tol: Tolerance, extra: Mapping[str, Any]
) -> None:
    """Evidence on success and failure: numbers, tolerance, one line per check (rule 22)."""
    rec: Callable[[str, Any], None] = cell.record
    rec(f"{label}.tolerance", tol.describe())
    rec(f"{label}.rtol", float(tol.rtol))
    rec(f"{label}.atol", float(tol.atol))
    if tol.reason:
        rec(f"{label}.tolerance_reason", tol.reason)
    finite = [d for d in verdicts.diffs if d.numel]
    rec(f"{label}.max_abs", max((d.max_abs for d in finite), default=0.0))
    rec(f"{label}.max_rel", max((d.max_rel for d in finite), default=0.0))
    rules: dict[str, int] = {}
    for d in finite:
        rules[d.rule] = rules.get(d.rule, 0) + 1
    if tol.twin is not None:
        twin_judged = [d for d in finite if d.rule != "table"]
        rec(f"{label}.judged_by", ", ".join(f"{r}: {n} tensors" for r, n in sorted(rules.items()))
            or "nothing compared")
        if twin_judged:
            worst = max(twin_judged, key=lambda d: d.twin_err / d.budget if d.budget else 0.0)
            drawn = "".join(f", {what} {value:.3g}" for what, value in (
                ("a second serial sample's", worst.second_err),
                ("the probes' move", worst.probe_err)) if value is not None)
            rec(f"{label}.twin_worst", f"{worst.name}: |cp - twin| {worst.twin_err:.3g} of "
                                       f"budget {worst.budget:.3g} (serial's own "
                                       f"{worst.serial_err:.3g}{drawn})")
        # what a tiny tensor's budget lets through, and where a 10% bug cannot fail
        tiny = [resolution_line(f"{check} {d.name}", d.budget, d.scale)
                for check, d in zip(verdicts.checks_of, verdicts.diffs, strict=True)
                if 0 < d.numel < POOL_BELOW and d.rule in ("twin", "twin-pooled")]
        if tiny:
            rec(f"{label}.resolution", "; ".join(tiny))
    for key, value in {**verdicts.evidence, **extra}.items():
        rec(f"{label}.{key}", value)
    for check in CHECKS:
        lines = verdicts.lines.get(check, [])
        skipped = verdicts.skipped.get(check, "")
        if check in verdicts.problems:
            text = "FAILED: " + " | ".join(verdicts.problems[check])
        elif lines:
            text = "ok: " + "; ".join(lines)
        elif skipped:
            text = "skipped: " + skipped
        elif check in verdicts.lines:
            text = "ok"
        else:
            continue
        rec(f"{label}.check.{check}", text)
        if cell.rank == 0 or check in verdicts.problems:
            print(f"[cpmatrix.parity rank{cell.rank}] {label}.{check}: {text}", flush=True)


def raise_if_failed(label: str, problems: dict[str, list[str]]) -> None:
    failed = [c for c in CHECKS if c in problems]
    if not failed:
        return
    blocks = [f"{label}: {len(failed)} check(s) failed: {', '.join(failed)}"]
    for check in failed:
        blocks.extend(f"- [{check}] {text}" for text in problems[check])
    error = _ERROR_FOR.get(failed[0], ParityError)
    raise error(failed[0], "\n".join(blocks), failed=failed)


def finish(cell: Any, verdicts: Verdicts, tol: Tolerance, perturbed: list[str]) -> ParityReport:
    """Agree across ranks, record the evidence, raise on any failure, else report."""
    verdicts.problems = agree(verdicts.problems, cell.mesh)
    mesh = "x".join(str(int(s)) for s in cell.mesh.shape)
    failed = ",".join(c for c in CHECKS if c in verdicts.problems)
    extra: dict[str, Any] = {"mesh": mesh, "world_size": cell.world_size}
    if failed:
        extra["failed"] = failed
    emit(cell, verdicts.label, verdicts, tol, extra)
    raise_if_failed(verdicts.label, verdicts.problems)
    # Plain strings for keys (a Check member would show as <Check.X: 'x'> in a repr).
    checks = {str(c): "; ".join(lines) for c, lines in verdicts.lines.items()}
    checks.update({str(c): f"skipped: {why}" for c, why in verdicts.skipped.items()})
    return ParityReport(verdicts.label, tol, tuple(verdicts.diffs), checks, tuple(perturbed))
