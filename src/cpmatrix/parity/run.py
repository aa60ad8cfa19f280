"""``check_parity``: one call that runs a CP implementation against its serial twin.

It does everything the anti-vacuous rules ask, so a case cannot forget one:

1. resolve the tolerance from the table (a looser one needs a written reason);
2. convert both sides to the cell's dtype, perturb zero/constant-initialised parameters,
   load ONE state_dict into both (CP converted first: no fp32 round trip), check the CP
   weights are bitwise the serial ones;
3. draw inputs from ``cell.generator`` (identical on every rank) and distribute them with
   the toolkit's distributor (:func:`cpmatrix.parity.data.distribute`);
4. forward both sides (under autocast if the cell says so);
5. backward with an explicit **random** grad_output (never ``.sum().backward()``);
6. compare the output (``full_tensor()``), every input grad and every parameter grad by
   name; check sharding is active, replicated values identical across ranks, grads
   non-zero and finite;
7. agree on the verdict across ranks, record evidence (max abs/rel diff, tolerance, one
   line per check) and raise one :class:`ParityError` listing every failure.

With ``optimizer=`` it runs a training workflow instead (see :mod:`._training`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

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
from cpmatrix.parity._training import OptimizerFactory, run_training
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
    is_dtensor,
    replicated_problems,
)
from cpmatrix.parity.compare import compare_named, flatten
from cpmatrix.parity.dtypes import autocast_ctx
from cpmatrix.parity.errors import ParityError, odd_input_fails
from cpmatrix.parity.tolerance import Tolerance, resolve_tolerance

__all__ = ["ParityReport", "check_parity"]

#: ``activations()``: name -> value the CP forward produced (DTensors whose ``Shard``
#: placements show the parallel path is active: a heads-sharded attention activation).
Activations = Callable[[], Mapping[str, Any]]


def check_parity(
    cell: Any,
    serial: torch.nn.Module | Callable[..., Any],
    cp: torch.nn.Module | Callable[..., Any],
    *,
    inputs: Mapping[str, Any],
    placements: Mapping[str, Placements] | None = None,
    output_axes: Mapping[str, Axes] | Axes | None = None,
    tolerance: Tolerance | None = None,
    perturb: bool = True,
    allow_zero: Mapping[str, str] | None = None,
    prepare_cp: PrepareCP | None = None,
    activations: Activations | None = None,
    optimizer: OptimizerFactory | None = None,
    steps: int = 3,
    loss: Callable[[Any], torch.Tensor] | None = None,
    label: str = "parity",
) -> ParityReport:
    """Run ``serial`` and ``cp`` on the same inputs and weights; compare everything.

    ``serial``/``cp``: modules or callables, called as ``fn(**inputs)`` (wrap an
    ``autograd.Function`` in a lambda). ``inputs``: name -> :class:`TensorSpec` (drawn from
    ``cell.generator``), a tensor (the serial value), a :class:`FeatureBatch` (serial view to
    ``serial``, CP view to ``cp``), or any other value (passed to both). ``placements``:
    name -> placements over ("cp0", "cp1") for the CP side (default: replicated DTensor;
    ``None``: the plain tensor), or over named dims of the cell's mesh (``{"cp1": Shard(1)}``:
    a DTensor on ``cell.mesh["cp1"]``, as tensor and sequence parallel plans on that axis take
    it). ``output_axes``: symbolic axes of outputs laid out by the
    batch's layout (``("N", None)``, or ``{"out.0": ("N", None)}``), mapped back before
    comparing. ``tolerance``: default the table row of the cell; a looser one needs
    :meth:`Tolerance.loosen` with a reason. ``allow_zero``: name -> reason for an output or
    grad that is legitimately all zero. ``prepare_cp(module, mesh)``: runs after loading the
    weights (``distribute_module``, ``parallelize_module(m, mesh["cp1"], plan)``,
    ``fully_shard(m, mesh=mesh["cp0"])``). ``activations()``: called after the CP forward,
    name -> values it produced (e.g. a heads-sharded DTensor) that count for
    ``sharding_active`` besides the inputs, outputs and the module's sharded parameters and
    buffers. DTensors may live on the cell's mesh or any mesh derived from it (a sub-mesh,
    the flattened mesh); one on another mesh fails ``setup``. ``optimizer``: a factory such as
    ``lambda ps: torch.optim.SGD(ps, lr=0.1)`` switches to the workflow level: ``steps``
    training steps (``TensorSpec`` inputs drawn afresh each step), comparing the per-step
    loss, the first step's parameter grads and the weight deltas; ``loss(output)`` defaults
    to a random projection of the outputs.

    Raises :class:`ParityError` (``.check``: first failing check, ``.failed``: all) on every
    rank alike; returns a :class:`ParityReport` otherwise. Arguments the toolkit cannot use
    fail ``setup`` (or ``tolerance``); an exception of ``serial``, ``cp``, ``prepare_cp`` or
    ``activations`` themselves is theirs and propagates unchanged.

    Example (a complete case)::

        from torch.distributed.tensor import Shard
        from cpmatrix.parity import TensorSpec, check_parity

        def cp_linear_case(cell):
            serial = torch.nn.Linear(16, 8)
            cp = CPLinear(16, 8)                 # same parameter names as nn.Linear
            check_parity(cell, serial, cp,
                         inputs={"x": TensorSpec(shape=(12, 16))},
                         placements={"x": [Shard(0), Shard(0)]})
    """
    try:
        with odd_input_fails("tolerance"):
            tol = resolve_tolerance(
                tolerance, dtype=cell.dtype, autocast=cell.autocast, path=cell.path
            )
    except ParityError as exc:
        cell.record(f"{label}.check.tolerance", f"FAILED: {exc}")
        raise
    verdicts = Verdicts(label)
    verdicts.lines["tolerance"] = [tol.describe()]
    if optimizer is not None:
        if not isinstance(steps, int) or steps < 1:
            raise ParityError("setup", f"steps must be an int >= 1, got {steps!r}")
        return run_training(
            cell,
            serial,
            cp,
            inputs=inputs,
            placements=placements or {},
            output_axes=output_axes,
            tol=tol,
            perturb=perturb,
            allow_zero=allow_zero or {},
            prepare_cp=prepare_cp,
            activations=activations,
            optimizer=optimizer,
            steps=steps,
            loss=loss,
            verdicts=verdicts,
        )
    perturbed: list[str] = []
    if isinstance(serial, torch.nn.Module):
        cp, perturbed, weights = load_modules(
            cell, serial, cp, perturb=perturb, prepare_cp=prepare_cp
        )
        verdicts.add("setup", weights)
    verdicts.lines.setdefault("nonzero", []).append(perturbed_line(perturbed, perturb))
    with odd_input_fails("setup"):
        ins = materialize(cell, inputs, placements or {})
    verdicts.lines.setdefault("setup", []).append(_inputs_line(ins))
    serial_params, cp_params = named_params(serial), named_params(cp)
    check_same_names("parameters", serial_params, cp_params)
    verdicts.add(
        "replicated_identical",
        replicated_problems(
            {
                **tensors_of(ins.serial, "input "),
                **{f"param {n}": p for n, p in serial_params.items()},
            },
            cell.mesh,
        ),
    )

    with autocast_ctx(cell):
        s_out = serial(**ins.serial)
        c_out = cp(**ins.cp)
    s_leaves, c_leaves = dict(flatten(s_out)), dict(flatten(c_out))
    check_same_names("outputs", s_leaves, c_leaves)
    with odd_input_fails("setup"):
        axes_of = output_axes_map(output_axes, s_leaves)
    declared = dict(activations()) if activations is not None else {}
    verdicts.check_sharding(
        {
            **tensors_of(ins.cp, "input "),
            **tensors_of(c_leaves, ""),
            **sharded_state(cp, cp_params),
            **tensors_of(declared, "activation "),
        },
        cell.mesh,
    )
    with odd_input_fails("output"):  # a CP output that does not fit its axes fails here
        outputs = {n: (serial_layout(ins, c_leaves[n], axes_of.get(n)), s)
                   for n, s in s_leaves.items()}
    verdicts.add_diffs("output", compare_named(outputs, tol), tol)
    verdicts.add("replicated_identical", replicated_problems(tensors_of(c_leaves, ""), cell.mesh))

    backward(cell, ins, s_leaves, c_leaves, axes_of, verdicts)

    with odd_input_fails("input_grad"):
        input_pairs = {n: (serial_layout(ins, leaf.cp.grad, leaf.axes), leaf.serial.grad)
                       for n, leaf in ins.leaves.items()}
    verdicts.add_diffs("input_grad", compare_named(input_pairs, tol), tol)
    input_grads = {n: leaf.cp.grad for n, leaf in ins.leaves.items() if leaf.cp.grad is not None}
    verdicts.check_placements({f"grad {n}": g for n, g in input_grads.items()}, cell.mesh)
    verdicts.add("input_grad", replicated_problems(input_grads, cell.mesh))
    check_param_grads(verdicts, serial_params, cp_params, tol, cell.mesh)
    verdicts.add(
        "nonzero",
        grad_problems(
            {
                **{
                    n: s.detach()
                    for n, s in s_leaves.items()
                    if isinstance(s, torch.Tensor) and s.is_floating_point()
                },
                **{f"grad {n}": leaf.serial.grad for n, leaf in ins.leaves.items()},
                **{f"grad {n}": p.grad for n, p in serial_params.items()},
            },
            allow_zero=allow_zero,
        ),
    )
    return finish(cell, verdicts, tol, perturbed)


def _inputs_line(ins: Inputs) -> str:
    shapes = [f"{n} {tuple(v.shape)}" for n, v in tensors_of(ins.serial, "").items()]
    return "inputs from cell.generator: " + ", ".join(shapes)


def backward(
    cell: Any,
    ins: Inputs,
    s_leaves: Mapping[str, Any],
    c_leaves: Mapping[str, Any],
    axes_of: Mapping[str, Axes],
    verdicts: Verdicts,
) -> None:
    """Backward both sides with one random grad_output per differentiable output."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    s_outs: list[torch.Tensor] = []
    s_grads: list[torch.Tensor] = []
    c_outs: list[Any] = []
    c_grads: list[Any] = []
    for name, s in s_leaves.items():
        if not (isinstance(s, torch.Tensor) and s.requires_grad):
            continue
        c = c_leaves[name]
        if not (isinstance(c, torch.Tensor) and c.requires_grad):
            verdicts.add(
                "output",
                CheckOutcome(
                    problems=[
                        f"{name}: serial output is differentiable, the CP one is not (detached?)"
                    ]
                ),
            )
            continue
        g = draw(cell.generator, s.shape, s.dtype, s.device)
        axes = axes_of.get(name)
        full = ins.batch.layout.to_cp(g, axes) if axes is not None and ins.batch else g
        s_outs.append(s)
        s_grads.append(g)
        if tuple(c.shape) != tuple(full.shape):
            continue  # the output check failed on its shape: no grad_output fits it
        c_outs.append(c)
        if is_dtensor(c):
            # a Partial output's grad is replicated: every rank's partial sees the same grad
            dt: Any = c
            places = [Replicate() if p.is_partial() else p for p in dt.placements]
            c_grads.append(distribute_tensor(full, dt.device_mesh, places, src_data_rank=None))
        else:
            c_grads.append(full.clone())
    if not s_outs:
        verdicts.skipped["input_grad"] = "no differentiable output"
        verdicts.skipped["param_grad"] = "no differentiable output"
        return
    torch.autograd.backward(s_outs, s_grads)
    if c_outs:
        torch.autograd.backward(c_outs, c_grads)
