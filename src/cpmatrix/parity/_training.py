"""The workflow level of :func:`check_parity`: N optimizer steps, loss and weight deltas.

A training step can be right at step 0 and drift later (a replicated parameter updated
from a per-rank partial grad, an optimizer state that is sharded wrongly), so the loss is
compared at every step and the weights after the last one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from cpmatrix.parity._inputs import (
    Axes,
    Placements,
    draw,
    materialize,
    output_axes_map,
    serial_layout,
    tensors_of,
)
from cpmatrix.parity._verdicts import ParityReport, Verdicts, check_param_grads, finish
from cpmatrix.parity._weights import (
    PrepareCP,
    check_same_names,
    load_modules,
    named_params,
    perturbed_line,
    sharded_state,
)
from cpmatrix.parity.checks import (
    CheckOutcome,
    grad_problems,
    replicated_problems,
)
from cpmatrix.parity.compare import compare_named, flatten, to_full
from cpmatrix.parity.dtypes import autocast_ctx
from cpmatrix.parity.errors import ParityError, odd_input_fails
from cpmatrix.parity.tolerance import Tolerance

__all__ = ["OptimizerFactory", "run_training"]

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def run_training(
    cell: Any,
    serial: Any,
    cp: Any,
    *,
    inputs: Mapping[str, Any],
    placements: Mapping[str, Placements],
    output_axes: Mapping[str, Axes] | Axes | None,
    tol: Tolerance,
    perturb: bool,
    allow_zero: Mapping[str, str],
    prepare_cp: PrepareCP | None,
    activations: Callable[[], Mapping[str, Any]] | None,
    optimizer: OptimizerFactory,
    steps: int,
    loss: Callable[[Any], torch.Tensor] | None,
    verdicts: Verdicts,
) -> ParityReport:
    if not (isinstance(serial, torch.nn.Module) and isinstance(cp, torch.nn.Module)):
        raise ParityError("setup", "the workflow level (optimizer=...) needs two nn.Modules")
    cp, perturbed, weights = load_modules(cell, serial, cp, perturb=perturb, prepare_cp=prepare_cp)
    verdicts.add("setup", weights)
    verdicts.lines.setdefault("nonzero", []).append(perturbed_line(perturbed, perturb))
    s_params, c_params = named_params(serial), named_params(cp)
    check_same_names("parameters", s_params, c_params)
    s_before = {n: p.detach().clone() for n, p in s_params.items()}
    c_before = {n: to_full(p.detach()).clone() for n, p in c_params.items()}
    s_opt, c_opt = optimizer(serial.parameters()), optimizer(cp.parameters())
    losses: dict[str, tuple[Any, Any]] = {}
    for step in range(steps):
        with odd_input_fails("setup"):
            ins = materialize(cell, inputs, placements)
        with autocast_ctx(cell):
            s_out = serial(**ins.serial)
            c_out = cp(**ins.cp)
        s_leaves, c_leaves = dict(flatten(s_out)), dict(flatten(c_out))
        check_same_names("outputs", s_leaves, c_leaves)
        with odd_input_fails("setup"):
            axes_of = output_axes_map(output_axes, s_leaves)
        if step == 0:
            verdicts.add(
                "replicated_identical",
                replicated_problems(tensors_of(ins.serial, "input "), cell.mesh),
            )
            declared = dict(activations()) if activations is not None else {}
            verdicts.check_sharding(
                {
                    **tensors_of(ins.cp, "input "),
                    **tensors_of(c_leaves, ""),
                    **sharded_state(cp, c_params),
                    **tensors_of(declared, "activation "),
                },
                cell.mesh,
            )
            with odd_input_fails("output"):
                outputs = {n: (serial_layout(ins, c_leaves[n], axes_of.get(n)), s)
                           for n, s in s_leaves.items()}
            verdicts.add_diffs("output", compare_named(outputs, tol), tol)
        if loss is None:
            # a random projection: the loss's grad w.r.t. each output is random, so a
            # sign or permutation bug in a backward cannot hide behind a uniform grad
            s_loss: torch.Tensor = torch.zeros((), dtype=torch.float64, device=cell.device)
            c_loss: torch.Tensor = torch.zeros((), dtype=torch.float64, device=cell.device)
            for name, s in s_leaves.items():
                if isinstance(s, torch.Tensor) and s.requires_grad:
                    r = draw(cell.generator, s.shape, s.dtype, s.device)
                    with odd_input_fails("loss"):
                        c = serial_layout(ins, c_leaves[name], axes_of.get(name))
                    s_loss = s_loss + (s * r).sum()
                    c_loss = c_loss + (c * r).sum()
        else:
            s_loss, c_loss = loss(s_out), to_full(loss(c_out))
        if step == 0:
            verdicts.add("nonzero", _uniform_grad_problems(s_loss, s_leaves))
        losses[f"loss[{step}]"] = (c_loss.detach(), s_loss.detach())
        s_opt.zero_grad(set_to_none=True)
        c_opt.zero_grad(set_to_none=True)
        torch.autograd.backward([s_loss])
        torch.autograd.backward([c_loss])
        if step == 0:
            check_param_grads(verdicts, s_params, c_params, tol, cell.mesh)
            verdicts.add(
                "nonzero",
                grad_problems(
                    {f"grad {n}": p.grad for n, p in s_params.items()}, allow_zero=allow_zero
                ),
            )
        s_opt.step()
        c_opt.step()
    verdicts.add_diffs("loss", compare_named(losses, tol), tol)
    s_delta = {n: p.detach() - s_before[n] for n, p in s_params.items()}
    c_delta = {n: to_full(p.detach()) - c_before[n] for n, p in c_params.items()}
    verdicts.add_diffs(
        "weight_delta", compare_named({n: (c_delta[n], d) for n, d in s_delta.items()}, tol), tol
    )
    verdicts.add(
        "nonzero",
        grad_problems({f"delta {n}": d for n, d in s_delta.items()}, allow_zero=allow_zero),
    )
    # replicas that drifted apart are weight deltas that differ across ranks
    verdicts.add(
        "weight_delta",
        replicated_problems({f"param {n}": p for n, p in c_params.items()}, cell.mesh),
    )
    verdicts.lines.setdefault("loss", []).append(
        "losses " + ", ".join(f"{float(s):.6g}" for _, s in losses.values())
    )
    return finish(cell, verdicts, tol, perturbed)


def _uniform_grad_problems(loss: torch.Tensor, leaves: Mapping[str, Any]) -> CheckOutcome:
    """A loss whose grad w.r.t. an output is constant (``out.sum()``) masks backward bugs."""
    out = CheckOutcome()
    named = [(n, s) for n, s in leaves.items() if isinstance(s, torch.Tensor) and s.requires_grad]
    if not named:
        out.problems.append("no differentiable output: nothing is trained")
        return out
    grads = torch.autograd.grad(loss, [s for _, s in named], retain_graph=True, allow_unused=True)
    for (name, s), g in zip(named, grads, strict=True):
        if g is not None and s.numel() > 1 and bool((g == g.reshape(-1)[0]).all()):
            out.problems.append(
                f"d loss / d {name} is uniform ({float(g.reshape(-1)[0]):.3g}): "
                f"a sign/permutation bug in a backward would hide"
            )
    if not out.problems:
        out.lines.append("loss gradient w.r.t. the outputs is non-uniform")
    return out
