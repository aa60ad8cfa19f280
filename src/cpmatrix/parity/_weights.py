"""The weights of :func:`check_parity`: one state_dict in both modules, no fp32 round trip.

Private: cases use :mod:`cpmatrix.parity`'s public names only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from cpmatrix.parity._convert import convert_module
from cpmatrix.parity.checks import CheckOutcome, perturb_degenerate_
from cpmatrix.parity.dtypes import storage_dtype
from cpmatrix.parity.errors import Check, ParityError
from cpmatrix.parity.trees import to_full
from cpmatrix.parity.verdict import is_dtensor

__all__ = [
    "PrepareCP",
    "check_same_names",
    "load_modules",
    "named_buffers",
    "named_params",
    "perturbed_line",
    "sharded_state",
    "tied_groups",
]

#: ``prepare_cp(module, mesh)``: parallelizes the CP module after the weights are loaded.
PrepareCP = Callable[[torch.nn.Module, Any], torch.nn.Module | None]


def load_modules(
    cell: Any,
    serial: torch.nn.Module,
    cp: Any,
    *,
    perturb: bool,
    prepare_cp: PrepareCP | None,
) -> tuple[Any, list[str], CheckOutcome]:
    """Convert both sides to the test dtype, perturb degenerate params, load one state_dict.

    The conversion never changes what a model computes (:func:`convert_module`: complex
    buffers stay complex, integer ones untouched); the evidence lists every buffer. The CP
    module is converted *before* ``load_state_dict``: loading fp64 values into an fp32
    module and converting afterwards would round-trip them through fp32. Weights tied in
    serial (one parameter under two names) must still be tied after ``prepare_cp``.
    """
    dtype = storage_dtype(cell)
    weights = CheckOutcome()
    serial_lines = convert_module(serial, dtype=dtype, device=cell.device)
    weights.lines.append(f"converted to {dtype}: " + "; ".join(serial_lines))
    perturbed = perturb_degenerate_(serial, cell.generator) if perturb else []
    if not isinstance(cp, torch.nn.Module):
        return cp, perturbed, weights
    cp_lines = convert_module(cp, dtype=dtype, device=cell.device)
    if cp_lines != serial_lines:
        weights.lines.append("CP side converted: " + "; ".join(cp_lines))
    try:
        cp.load_state_dict(serial.state_dict(), strict=True)
    except RuntimeError as exc:
        raise ParityError(Check.SETUP, f"one state_dict must load into both sides: {exc}") from exc
    if prepare_cp is not None:
        cp = prepare_cp(cp, cell.mesh) or cp
    untied = tied_problems(serial, cp)
    if untied:
        raise ParityError(Check.SETUP, "; ".join(untied))
    serial_params = dict(serial.named_parameters(remove_duplicate=False))
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


def named_params(module: Any) -> dict[str, torch.Tensor]:
    if not isinstance(module, torch.nn.Module):
        return {}
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


def named_buffers(module: Any) -> dict[str, torch.Tensor]:
    """A module's buffers by name (persistent or not: a RoPE table computed in
    ``__init__`` is model state all the same); none for a plain callable."""
    if not isinstance(module, torch.nn.Module):
        return {}
    return dict(module.named_buffers())


def tied_groups(module: torch.nn.Module) -> list[list[str]]:
    """Names that share one parameter (tied weights), a list per parameter.

    >>> m = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 2), "out": torch.nn.Linear(2, 4)})
    >>> m["out"].weight = m["emb"].weight
    >>> tied_groups(m)
    [['emb.weight', 'out.weight']]
    """
    by_id: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def tied_problems(serial: torch.nn.Module, cp: torch.nn.Module) -> list[str]:
    """One problem per group of serial weights that is tied in serial but not on the CP
    side (parallelizing replaces parameters: a tie made before it is lost)."""
    problems = []
    for names in tied_groups(serial):
        try:
            params = [cp.get_parameter(n) for n in names]
        except AttributeError:
            continue  # a name the CP side lacks: check_same_names says so
        if any(p is not params[0] for p in params[1:]):
            problems.append(
                f"tied weights untied: {' and '.join(names)} are one parameter in serial "
                f"(tied) but separate parameters on the CP side after prepare_cp; "
                f"parallelizing replaces parameters, so re-tie them after it (e.g. "
                f"model.{names[1]} = model.{names[0]})")
    return problems


def sharded_state(module: Any, params: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The CP module's DTensor parameters and buffers, for ``sharding_active``: tensor
    parallel and FSDP shard weights, not inputs. ``params`` are taken before the forward
    (FSDP2 swaps unsharded parameters in while it runs)."""
    state = {f"param {n}": p for n, p in params.items() if is_dtensor(p)}
    if isinstance(module, torch.nn.Module):
        state.update({f"buffer {n}": b for n, b in module.named_buffers() if is_dtensor(b)})
    return state


def check_same_names(what: str, serial: Mapping[str, Any], cp: Mapping[str, Any]) -> None:
    missing, extra = sorted(set(serial) - set(cp)), sorted(set(cp) - set(serial))
    if missing or extra:
        raise ParityError(Check.SETUP,
                          f"{what} differ by name: only serial {missing}, only CP {extra}")


def perturbed_line(perturbed: list[str], perturb: bool) -> str:
    if not perturb:
        return "zero-init perturbation off"
    if perturbed:
        return f"perturbed zero/constant-initialised parameters {perturbed}"
    return "no zero/constant-initialised parameters"
