"""Shared machinery of :func:`check_parity`: inputs, weights, verdicts, evidence.

Private: cases use :mod:`cpmatrix.parity`'s public names only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cpmatrix.parity.checks import (
    CheckOutcome,
    gather_object_over_mesh,
    is_dtensor,
    perturb_degenerate_,
)
from cpmatrix.parity.compare import Diff, format_diffs, to_full
from cpmatrix.parity.data import FeatureBatch, distribute
from cpmatrix.parity.errors import (
    CHECKS,
    MismatchError,
    ParityError,
    ReplicationError,
    VacuousError,
)
from cpmatrix.parity.tolerance import Tolerance

Axes = tuple[str | int | None, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """An activation input: drawn from ``cell.generator`` (or given), identical on all ranks.

    ``shape`` may name symbolic axes of a :class:`FeatureBatch` among the inputs (``"N"``:
    the number of tokens); such dims go through the batch's layout (padding, re-layout)
    on the CP side and come back with :meth:`Layout.to_serial` for the grad comparison.

    Example::

        TensorSpec(shape=("N", 16))                 # tokens x 16, standard normal
        TensorSpec(shape=(7, 4), requires_grad=False)
        TensorSpec.of(my_tensor, axes=("N", None))  # a given serial value
    """

    shape: tuple[int | str, ...]
    dtype: torch.dtype | None = None
    requires_grad: bool = True
    scale: float = 1.0
    value: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        value: torch.Tensor,
        *,
        axes: Sequence[str | int | None] | None = None,
        requires_grad: bool | None = None,
    ) -> TensorSpec:
        shape = tuple(
            a if isinstance(a, str) else int(value.shape[i])
            for i, a in enumerate(axes or [None] * value.ndim)
        )
        grad = value.is_floating_point() if requires_grad is None else requires_grad
        return cls(shape=shape, dtype=value.dtype, requires_grad=grad, value=value)


@dataclass(slots=True)
class Leaf:
    """A differentiable input: the serial leaf, the CP leaf, and its axes (if laid out)."""

    serial: torch.Tensor
    cp: Any
    axes: Axes | None


@dataclass(slots=True)
class Inputs:
    serial: dict[str, Any] = field(default_factory=dict)
    cp: dict[str, Any] = field(default_factory=dict)
    leaves: dict[str, Leaf] = field(default_factory=dict)
    batch: FeatureBatch | None = None


def draw(
    gen: torch.Generator, shape: Sequence[int], dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """Standard normal in float64 from ``gen`` (same on every rank), then cast."""
    x = torch.randn(tuple(shape), generator=gen, dtype=torch.float64, device=gen.device)
    return x.to(device=device, dtype=dtype)


def find_batch(inputs: Mapping[str, Any]) -> FeatureBatch | None:
    batches = [v for v in inputs.values() if isinstance(v, FeatureBatch)]
    if len(batches) > 1:
        raise ParityError("setup", "at most one FeatureBatch among the inputs")
    return batches[0] if batches else None


def materialize(
    cell: Any,
    inputs: Mapping[str, Any],
    placements: Mapping[str, Sequence[Any] | None],
) -> Inputs:
    """Serial and CP keyword arguments, drawn in ``inputs`` order from ``cell.generator``."""
    from torch.distributed.tensor import Replicate

    unknown = sorted(set(placements) - set(inputs))
    if unknown:
        raise ParityError("setup", f"placements for unknown inputs {unknown}")
    out = Inputs(batch=find_batch(inputs))
    for name, value in inputs.items():
        if isinstance(value, FeatureBatch):
            out.serial[name], out.cp[name] = value.serial, value.cp
            continue
        if isinstance(value, torch.Tensor) and not is_dtensor(value):
            value = TensorSpec.of(value)
        if not isinstance(value, TensorSpec):
            out.serial[name] = out.cp[name] = value  # ints, flags, None: passed as is
            continue
        axes = tuple(a if isinstance(a, str) else None for a in value.shape)
        laid_out = any(isinstance(a, str) for a in value.shape)
        if laid_out and out.batch is None:
            raise ParityError(
                "setup",
                f"input {name!r} has symbolic axes {value.shape} but "
                f"no FeatureBatch is among the inputs",
            )
        shape = [
            out.batch.axis_size(a) if isinstance(a, str) and out.batch else int(a)
            for a in value.shape
        ]
        dtype = value.dtype or storage_dtype(cell)
        if value.value is not None:
            serial = value.value.detach().to(device=cell.device).clone()
        else:
            serial = draw(cell.generator, shape, dtype, cell.device) * value.scale
        grad = value.requires_grad and (serial.is_floating_point() or serial.is_complex())
        places = placements.get(name, [Replicate()] * cell.mesh.ndim)
        if places is None:
            cp: Any = serial.detach().clone()
        elif laid_out and out.batch is not None:
            cp = out.batch.distribute(serial, places, axes)
        else:
            cp = distribute(serial, cell.mesh, places)
        if grad:
            serial.requires_grad_(True)
            cp.requires_grad_(True)
            out.leaves[name] = Leaf(serial, cp, axes if laid_out else None)
        out.serial[name], out.cp[name] = serial, cp
    return out


_REDUCED = (torch.bfloat16, torch.float16)


def storage_dtype(cell: Any) -> torch.dtype:
    """The dtype parameters and inputs are held in for a cell.

    An autocast cell (``autocast=on``, ``dtype`` bf16/fp16) is mixed precision: weights and
    inputs stay float32 and the forward runs under ``torch.autocast(dtype=cell.dtype)``.
    Every other cell holds everything in ``cell.dtype``.

    Example::

        >>> from types import SimpleNamespace
        >>> storage_dtype(SimpleNamespace(dtype=torch.bfloat16, autocast=True))
        torch.float32
    """
    dtype: torch.dtype = cell.dtype
    if cell.autocast and dtype in _REDUCED:
        return torch.float32
    return dtype


def load_modules(
    cell: Any,
    serial: torch.nn.Module,
    cp: Any,
    *,
    perturb: bool,
    prepare_cp: Callable[[torch.nn.Module, Any], torch.nn.Module | None] | None,
) -> tuple[Any, list[str], CheckOutcome]:
    """Convert both sides to the test dtype, perturb degenerate params, load one state_dict.

    The CP module is converted *before* ``load_state_dict``: loading fp64 values into an
    fp32 module and converting afterwards would round-trip them through fp32.
    """
    serial.to(device=cell.device, dtype=storage_dtype(cell))
    perturbed = perturb_degenerate_(serial, cell.generator) if perturb else []
    weights = CheckOutcome()
    if not isinstance(cp, torch.nn.Module):
        return cp, perturbed, weights
    cp.to(device=cell.device, dtype=storage_dtype(cell))
    try:
        cp.load_state_dict(serial.state_dict(), strict=True)
    except RuntimeError as exc:
        raise ParityError("setup", f"one state_dict must load into both sides: {exc}") from exc
    if prepare_cp is not None:
        cp = prepare_cp(cp, cell.mesh) or cp
    serial_params = dict(serial.named_parameters())
    for name, param in cp.named_parameters():
        ref = serial_params.get(name)
        full = to_full(param.detach())
        if ref is None or full.dtype != ref.dtype or not torch.equal(full, ref.detach()):
            weights.problems.append(
                f"{name}: CP weight differs from serial after loading "
                f"(an fp32 round trip, or prepare_cp changed it?)"
            )
    weights.lines.append(
        f"{len(serial_params)} parameters loaded bitwise-identical in {storage_dtype(cell)}"
    )
    return cp, perturbed, weights


def autocast_ctx(cell: Any) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` to the cell's reduced dtype (or the device default) when on."""
    if not cell.autocast:
        return contextlib.nullcontext()
    device_type = torch.device(cell.device).type
    if cell.dtype in _REDUCED:
        return torch.autocast(device_type=device_type, dtype=cell.dtype)
    return torch.autocast(device_type=device_type)


def named_params(module: Any) -> dict[str, torch.Tensor]:
    if not isinstance(module, torch.nn.Module):
        return {}
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


def check_same_names(what: str, serial: Mapping[str, Any], cp: Mapping[str, Any]) -> None:
    missing, extra = sorted(set(serial) - set(cp)), sorted(set(cp) - set(serial))
    if missing or extra:
        raise ParityError("setup", f"{what} differ by name: only serial {missing}, only CP {extra}")


# --------------------------------------------------------------------------------------
# verdicts and evidence

_ERROR_FOR = {
    "replicated_identical": ReplicationError,
    "sharding_active": VacuousError,
    "nonzero": VacuousError,
    "output": MismatchError,
    "input_grad": MismatchError,
    "param_grad": MismatchError,
    "loss": MismatchError,
    "weight_delta": MismatchError,
}


@dataclass(slots=True)
class Verdicts:
    """Per-check problems and evidence lines, collected on one rank."""

    label: str
    problems: dict[str, list[str]] = field(default_factory=dict)
    lines: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    diffs: list[Diff] = field(default_factory=list)

    def add(self, check: str, outcome: CheckOutcome) -> None:
        self.lines.setdefault(check, []).extend(outcome.lines)
        if outcome.problems:
            self.problems.setdefault(check, []).extend(outcome.problems)
        if outcome.skipped:
            self.skipped[check] = outcome.skipped

    def add_diffs(self, check: str, diffs: list[Diff], tol: Tolerance) -> None:
        self.diffs.extend(diffs)
        bad = [d for d in diffs if not d.ok]
        if bad:
            self.problems.setdefault(check, []).append(format_diffs(check, diffs, tol))
        elif diffs:
            worst = max(diffs, key=lambda d: d.max_abs)
            self.lines.setdefault(check, []).append(
                f"{len(diffs)} tensors within tolerance, worst {worst.name}: max abs "
                f"{worst.max_abs:.3g}, max rel {worst.max_rel:.3g}"
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
    for key, value in extra.items():
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
