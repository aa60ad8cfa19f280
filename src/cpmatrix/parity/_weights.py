"""The weights of :func:`check_parity`: one state_dict in both modules, no fp32 round trip.

Private: cases use :mod:`cpmatrix.parity`'s public names only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from cpmatrix.parity.checks import CheckOutcome, perturb_degenerate_
from cpmatrix.parity.compare import to_full
from cpmatrix.parity.dtypes import storage_dtype
from cpmatrix.parity.errors import ParityError
from cpmatrix.parity.verdict import is_dtensor

__all__ = [
    "PrepareCP",
    "check_same_names",
    "load_modules",
    "named_params",
    "perturbed_line",
    "sharded_state",
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


def named_params(module: Any) -> dict[str, torch.Tensor]:
    if not isinstance(module, torch.nn.Module):
        return {}
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


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
        raise ParityError("setup", f"{what} differ by name: only serial {missing}, only CP {extra}")


def perturbed_line(perturbed: list[str], perturb: bool) -> str:
    if not perturb:
        return "zero-init perturbation off"
    if perturbed:
        return f"perturbed zero/constant-initialised parameters {perturbed}"
    return "no zero/constant-initialised parameters"
