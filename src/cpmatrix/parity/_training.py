"""The workflow level of :func:`check_parity`: N optimizer steps, loss and weight deltas.

A training step can be right at step 0 and drift later (a replicated parameter updated
from a per-rank partial grad, an optimizer state that is sharded wrongly), so the loss is
compared at every step and the weights after the last one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from cpmatrix.parity._buffers import BufferPlacements, plan_buffers, reduced
from cpmatrix.parity._convert import record_warnings, recording_warnings
from cpmatrix.parity._inputs import (
    Axes,
    Inputs,
    Placements,
    draw,
    materialize,
    output_axes_map,
    serial_layout,
    tensors_of,
)
from cpmatrix.parity._report import (
    ParityReport,
    Verdicts,
    check_buffers,
    check_param_grads,
    finish,
)
from cpmatrix.parity._second import attach, needs_second, row_shards, second_sample
from cpmatrix.parity._step import (
    EnterStep,
    check_sharding_active,
    compare_outputs,
    run_cp,
    twin_line,
)
from cpmatrix.parity._twin import (
    Twin,
    buffer_copies,
    make_twin,
    outputs_of,
    run_probes,
    upcast_inputs,
)
from cpmatrix.parity._weights import (
    PrepareCP,
    check_same_names,
    load_modules,
    named_buffers,
    named_params,
    perturbed_line,
)
from cpmatrix.parity.checks import (
    CheckOutcome,
    grad_problems,
    replicated_problems,
)
from cpmatrix.parity.compare import compare_named
from cpmatrix.parity.dtypes import autocast_ctx
from cpmatrix.parity.errors import Check, ParityError, odd_input_fails
from cpmatrix.parity.tolerance import Tolerance
from cpmatrix.parity.trees import flatten, to_full

__all__ = ["OptimizerFactory", "run_training"]

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[Any], torch.Tensor]


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
    buffers: BufferPlacements | None,
    optimizer: OptimizerFactory,
    steps: int,
    loss: LossFn | None,
    enter: EnterStep,
    verdicts: Verdicts,
) -> ParityReport:
    """``steps`` optimizer steps on each side (and on the fp64 twin, in fp32/bf16/fp16
    cells). The CP side's forward, loss and backward run inside ``enter()``; its optimizer
    step outside, as a training loop runs them."""
    if not (isinstance(serial, torch.nn.Module) and isinstance(cp, torch.nn.Module)):
        raise ParityError(Check.SETUP, "the workflow level (optimizer=...) needs two nn.Modules")
    warns: list[str] = []
    with recording_warnings(warns):
        cp, perturbed, weights = load_modules(
            cell, serial, cp, perturb=perturb, prepare_cp=prepare_cp)
        verdicts.add(Check.SETUP, weights)
        twin = make_twin(serial) if tol.twin is not None else Twin(why="fixed")
        verdicts.lines.setdefault(Check.NONZERO, []).append(perturbed_line(perturbed, perturb))
        s_params, c_params = named_params(serial), named_params(cp)
        check_same_names("parameters", s_params, c_params)
        t_params = named_params(twin.module) if twin.ok else {}
        s_before = {n: p.detach().clone() for n, p in s_params.items()}
        c_before = {n: to_full(p.detach()).clone() for n, p in c_params.items()}
        t_before = {n: p.detach().clone() for n, p in t_params.items()}
        s_start = buffer_copies(serial) if twin.ok else {}
        s_opt, c_opt = optimizer(serial.parameters()), optimizer(cp.parameters())
        t_opt: Any = None
        with twin.running():
            t_opt = optimizer(twin.module.parameters()) if twin.ok else None
        losses: dict[str, tuple[Any, ...]] = {}
        for step in range(steps):
            with odd_input_fails(Check.SETUP):
                ins = materialize(cell, inputs, placements)
            t_ins, _ = upcast_inputs(ins.serial, []) if twin.ok else ({}, {})
            s_leaves, axes_of, proj, s_loss = _serial_step(
                cell, serial, ins, output_axes, loss, s_opt, verdicts, first=step == 0)
            c_leaves, c_loss = _cp_step(cell, cp, ins, enter, s_leaves, axes_of, proj, loss,
                                        c_opt)
            t_out, t_loss, t_grads = _twin_step(twin, t_ins, proj, loss, t_opt)
            if step == 0:
                _sample_first_step(cell, verdicts, serial, s_start, ins, t_ins, s_leaves,
                                   {**s_params, **s_leaves}, twin, t_out, t_grads, tol)
                _first_step(cell, verdicts, ins, s_leaves, c_leaves, axes_of, tol, twin,
                            twin.outputs or t_out, activations, cp, c_params)
                _first_step_grads(cell, verdicts, s_params, c_params, t_params, tol, twin,
                                  allow_zero)
            losses[f"loss[{step}]"] = (
                c_loss.detach(), s_loss.detach(),
                t_loss.detach() if twin.ok and t_loss is not None else None)
            s_opt.step()
            c_opt.step()
            with twin.running():
                if twin.ok and t_opt is not None:
                    t_opt.step()
            with odd_input_fails(Check.SETUP):
                plan = plan_buffers(buffers, named_buffers(cp), cell.mesh)
            if step == 0:
                verdicts.lines.setdefault(Check.BUFFER, []).extend(b.line() for b in plan)
            check_buffers(verdicts, named_buffers(serial),
                          reduced(named_buffers(cp), plan, cell.mesh), tol,
                          named_buffers(twin.module) if twin.ok else {}, when=f"step {step}")
    record_warnings(verdicts, warns)
    verdicts.evidence["twin"] = twin_line(tol, twin)
    if not twin.ok:
        losses = {n: v[:2] for n, v in losses.items()}
    verdicts.add_diffs(Check.LOSS, compare_named(losses, tol), tol)
    _check_weight_deltas(cell, verdicts, tol, twin, (s_params, c_params, t_params),
                         (s_before, c_before, t_before), allow_zero)
    verdicts.lines.setdefault(Check.LOSS, []).append(
        "losses " + ", ".join(f"{float(v[1]):.6g}" for v in losses.values())
    )
    return finish(cell, verdicts, tol, perturbed)


#: The serial, CP and twin sides' parameters by name (the twin's empty without a twin).
_Weights = tuple[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor],
                 Mapping[str, torch.Tensor]]


def _check_weight_deltas(cell: Any, verdicts: Verdicts, tol: Tolerance, twin: Twin,
                         params: _Weights, before: _Weights,
                         allow_zero: Mapping[str, str]) -> None:
    """After the last step: each parameter's change (serial, CP, twin ``params`` against
    their values ``before`` the first step) compared, non-zero, and alike on every replica.
    """
    s_params, c_params, t_params = params
    s_before, c_before, t_before = before
    s_delta = {n: p.detach() - s_before[n] for n, p in s_params.items()}
    c_delta = {n: to_full(p.detach()) - c_before[n] for n, p in c_params.items()}
    t_delta = ({n: p.detach() - t_before[n] for n, p in t_params.items()}
               if twin.ok else {})
    verdicts.add_diffs(
        Check.WEIGHT_DELTA,
        compare_named({n: (c_delta[n], d, t_delta.get(n)) for n, d in s_delta.items()}, tol),
        tol,
    )
    verdicts.add(
        Check.NONZERO,
        grad_problems({f"delta {n}": d for n, d in s_delta.items()}, allow_zero=allow_zero),
    )
    # replicas that drifted apart are weight deltas that differ across ranks
    verdicts.add(
        Check.WEIGHT_DELTA,
        replicated_problems({f"param {n}": p for n, p in c_params.items()}, cell.mesh),
    )


def _serial_step(
    cell: Any, serial: Any, ins: Inputs, output_axes: Mapping[str, Axes] | Axes | None,
    loss: LossFn | None, s_opt: torch.optim.Optimizer, verdicts: Verdicts, *, first: bool,
) -> tuple[dict[str, Any], dict[str, Axes], dict[str, torch.Tensor], torch.Tensor]:
    """The serial side's forward, loss and backward of one step; its outputs by name,
    their axes, the step's random projections (drawn here: the loss when ``loss`` is
    None) and its loss. On the ``first`` step, also checks the loss's grad is not uniform.
    """
    with autocast_ctx(cell):
        s_out = serial(**ins.serial)
    s_leaves = dict(flatten(s_out))
    with odd_input_fails(Check.SETUP):
        axes_of = output_axes_map(output_axes, s_leaves)
    proj = _projections(cell, s_leaves) if loss is None else {}
    s_loss = _loss(s_out, s_leaves, proj, loss)
    if first:
        verdicts.add(Check.NONZERO, _uniform_grad_problems(s_loss, s_leaves))
    s_opt.zero_grad(set_to_none=True)
    torch.autograd.backward([s_loss])
    return s_leaves, axes_of, proj, s_loss


def _cp_step(
    cell: Any, cp: Any, ins: Inputs, enter: EnterStep, s_leaves: Mapping[str, Any],
    axes_of: Mapping[str, Axes], proj: Mapping[str, torch.Tensor], loss: LossFn | None,
    c_opt: torch.optim.Optimizer,
) -> tuple[dict[str, Any], torch.Tensor]:
    """The CP side's forward, loss and backward of one step, inside ``enter()`` (its
    optimizer step follows outside it); its outputs by name and its loss."""
    with enter(ins.cp):
        with autocast_ctx(cell):
            c_out = run_cp(cp, ins)
        c_leaves = dict(flatten(c_out))
        check_same_names("outputs", s_leaves, c_leaves)
        with odd_input_fails(Check.LOSS):
            c_laid = {n: serial_layout(ins, c_leaves[n], axes_of.get(n)) for n in proj}
        c_loss = to_full(_loss(c_out, c_laid, proj, loss))
        c_opt.zero_grad(set_to_none=True)
        torch.autograd.backward([c_loss])
    return c_leaves, c_loss


def _twin_step(
    twin: Twin, t_ins: Mapping[str, Any], proj: Mapping[str, torch.Tensor],
    loss: LossFn | None, t_opt: torch.optim.Optimizer | None,
) -> tuple[dict[str, Any], Any, dict[str, torch.Tensor]]:
    """The fp64 twin's forward, loss and backward of one step (nothing without a twin);
    its outputs by name, its loss, and the loss's grad w.r.t. each differentiable output
    (the grad_outputs that give the step's parameter grads: the projections themselves
    for the default loss)."""
    t_out: dict[str, Any] = {}
    t_loss: Any = None
    t_grads: dict[str, torch.Tensor] = {}
    with twin.running():
        if twin.ok:
            raw = twin.module(**t_ins)
            t_out = outputs_of(raw)
            t_loss = _loss(raw, t_out, proj, loss)
            assert t_opt is not None
            t_opt.zero_grad(set_to_none=True)
            named = [(n, v) for n, v in t_out.items()
                     if isinstance(v, torch.Tensor) and v.requires_grad]
            if loss is None:
                t_grads = {n: proj[n] for n, _ in named if n in proj}
            elif named and t_loss.requires_grad:
                found = torch.autograd.grad(t_loss, [v for _, v in named], retain_graph=True,
                                            allow_unused=True)
                t_grads = {n: g.detach() for (n, _), g in zip(named, found, strict=True)
                           if g is not None}
            torch.autograd.backward([t_loss])
    return t_out, t_loss, t_grads


def _sample_first_step(
    cell: Any, verdicts: Verdicts, serial: Any, s_start: Mapping[str, torch.Tensor],
    ins: Inputs, t_ins: Mapping[str, Any], s_leaves: Mapping[str, Any],
    compared: Mapping[str, Any], twin: Twin, t_out: Mapping[str, Any],
    t_grads: Mapping[str, torch.Tensor], tol: Tolerance,
) -> None:
    """Step 0 judged as a step check judges its step: the twin probed (the elements a
    rounding-sized step flips are judged apart) and, where a compared tensor has fewer
    than 16 elements and the CP side shards the rows, the serial side's second sample in
    the cell's precision (:mod:`._second`). Both backward with the loss's grad w.r.t. the
    outputs (``t_grads``). The later steps and the weight deltas keep the unprobed rule:
    docs/parity.md, "The second serial sample"."""
    if not (twin.ok and tol.twin is not None and t_grads):
        return
    twin.outputs = {n: v.detach() for n, v in t_out.items() if isinstance(v, torch.Tensor)}
    twin.input_grads = {}
    twin.param_grads = {n: p.grad for n, p in named_params(twin.module).items()}
    parts = row_shards(ins.cp)
    sample = (second_sample(serial, s_start, ins.serial, [], s_leaves, t_grads, twin, parts,
                            lambda: autocast_ctx(cell))
              if parts > 1 and needs_second(compared) else None)
    run_probes(twin, t_ins, [], t_grads, tol.twin.eps)
    if sample is not None:
        attach(twin, sample)
        verdicts.evidence["second_sample"] = f"step 0: {sample.line()}"


def _projections(cell: Any, s_leaves: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A random projection per differentiable output (drawn in output order): the loss's
    grad w.r.t. each output is random, so a sign or permutation bug in a backward cannot
    hide behind a uniform grad."""
    return {name: draw(cell.generator, s.shape, s.dtype, s.device)
            for name, s in s_leaves.items()
            if isinstance(s, torch.Tensor) and s.requires_grad}


def _loss(out: Any, leaves: Mapping[str, Any], proj: Mapping[str, torch.Tensor],
          loss: LossFn | None) -> torch.Tensor:
    """``loss(out)``, or the random projection of the outputs (``leaves``: by name, in the
    serial layout) summed in float64."""
    if loss is not None:
        return loss(out)
    total: torch.Tensor = torch.zeros((), dtype=torch.float64)
    for name, r in proj.items():
        value = leaves[name]
        total = total.to(value.device) + (value * r.to(value.dtype)).sum()
    return total


def _first_step(
    cell: Any, verdicts: Verdicts, ins: Inputs, s_leaves: Mapping[str, Any],
    c_leaves: Mapping[str, Any], axes_of: Mapping[str, Axes], tol: Tolerance, twin: Twin,
    t_out: Mapping[str, Any], activations: Callable[[], Mapping[str, Any]] | None,
    cp: Any, c_params: Mapping[str, torch.Tensor],
) -> None:
    """Step 0's inputs, sharding and outputs (the later steps' are the same kind)."""
    verdicts.add(
        Check.REPLICATED_IDENTICAL,
        replicated_problems(tensors_of(ins.serial, "input "), cell.mesh),
    )
    check_sharding_active(cell, verdicts, ins, c_leaves, cp, c_params, activations)
    # Not ``t_out`` alone: a twin that failed in its backward has its outputs already.
    compare_outputs(verdicts, ins, s_leaves, c_leaves, axes_of, t_out if twin.ok else {}, tol)


def _first_step_grads(
    cell: Any, verdicts: Verdicts, s_params: Mapping[str, torch.Tensor],
    c_params: Mapping[str, torch.Tensor], t_params: Mapping[str, torch.Tensor],
    tol: Tolerance, twin: Twin, allow_zero: Mapping[str, str],
) -> None:
    """Step 0's parameter grads: CP against serial (and the twin's), serial ones non-zero
    (later steps' grads show in the weight deltas)."""
    # the probed values with their second sample where step 0 took them
    t_grads = twin.param_grads or {n: p.grad for n, p in t_params.items()}
    check_param_grads(verdicts, s_params, c_params, tol, cell.mesh, t_grads if twin.ok else {})
    verdicts.add(
        Check.NONZERO,
        grad_problems(
            {f"grad {n}": p.grad for n, p in s_params.items()},
            allow_zero=allow_zero,
        ),
    )


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
