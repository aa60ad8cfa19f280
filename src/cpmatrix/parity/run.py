"""``check_parity``: one call that runs a CP implementation against its serial twin.

It does everything the anti-vacuous rules ask, so a case cannot forget one:

1. resolve the tolerance from the table (a looser one needs a written reason);
2. convert both sides to the cell's dtype without changing what they compute (complex
   buffers stay complex, integer ones untouched), perturb zero/constant-initialised
   parameters, load ONE state_dict into both (CP converted first: no fp32 round trip),
   check the CP weights are bitwise the serial ones and tied weights still tied;
3. draw inputs from ``cell.generator`` (identical on every rank), tensors inside nested
   inputs too, and distribute them with the toolkit's distributor
   (:func:`cpmatrix.parity.data.distribute`);
4. forward and backward the serial side (under autocast if the cell says so), with an
   explicit **random** grad_output (never ``.sum().backward()``), then the CP side's whole
   step inside ``context()`` (``loss_parallel`` and the like);
5. in fp32/bf16/fp16 cells run the serial side again in fp64 (the twin, :mod:`._twin`):
   the reference each low-precision result is judged against;
6. compare the output (``full_tensor()``), every input grad, every parameter grad and every
   buffer by name; check sharding is active, replicated values identical across ranks,
   grads non-zero and finite; record every warning either side raised;
7. agree on the verdict across ranks, record evidence (max abs/rel diff, tolerance, one
   line per check) and raise one :class:`ParityError` listing every failure.

With ``optimizer=`` it runs a training workflow instead (see :mod:`._training`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from cpmatrix.parity._buffers import BufferPlacements, PartialBuffer, plan_buffers, reduced
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
    mesh_sizes,
)
from cpmatrix.parity._second import attach, needs_second, row_shards, second_sample
from cpmatrix.parity._step import (
    ContextFactory,
    EnterStep,
    check_sharding_active,
    compare_outputs,
    cp_context,
    run_cp,
    shape_mismatches,
    skip_grads_for_shapes,
    twin_line,
)
from cpmatrix.parity._training import OptimizerFactory, run_training
from cpmatrix.parity._twin import (
    Twin,
    backward_twin,
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
    is_dtensor,
    replicated_problems,
)
from cpmatrix.parity.compare import compare_named
from cpmatrix.parity.dtypes import autocast_ctx
from cpmatrix.parity.errors import Check, ParityError, odd_input_fails
from cpmatrix.parity.tolerance import Tolerance, resolve_tolerance
from cpmatrix.parity.trees import flatten

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
    context: ContextFactory | None = None,
    buffers: BufferPlacements | None = None,
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
    to a random projection of the outputs. ``context``: a factory of a context manager
    (``loss_parallel``, not ``loss_parallel()``; or one taking the CP side's inputs of the
    step, ``lambda ins: context_parallel(mesh, buffers=[ins["x"]], buffer_seq_dims=[1])``)
    entered around the CP side's whole step: forward, loss and backward, as a training
    loop runs them (the optimizer step follows outside it); the serial side and the fp64
    twin run outside it. ``buffers``: buffer name -> ``{mesh dim: Partial()}`` for a CP
    buffer that is partial by design (a MoE's per-rank ``tokens_per_expert``, all-reduced
    later in the training loop): a copy is reduced over those dims before it is compared.

    Tensors anywhere inside an input (lists, tuples, dicts, dataclasses) are inputs like
    any other (named ``batch.tokens``; ``placements`` may name them so), and so are
    tensors inside outputs. Every buffer is compared by name after backward. In
    fp32/bf16/fp16 cells the serial side runs again in fp64 (the twin) and each value is
    judged by the fp64 twin rule (:class:`~cpmatrix.parity.tolerance.TwinRule`); where no
    twin value exists, the table's fixed row judges it, labelled so in the evidence.

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
        with odd_input_fails(Check.TOLERANCE):
            tol = resolve_tolerance(
                tolerance, dtype=cell.dtype, autocast=cell.autocast, path=cell.path
            )
    except ParityError as exc:
        cell.record(f"{label}.check.{Check.TOLERANCE}", f"FAILED: {exc}")
        raise
    verdicts = Verdicts(label, sizes=mesh_sizes(cell.mesh))
    verdicts.lines[Check.TOLERANCE] = [tol.describe()]
    enter = cp_context(context)
    if optimizer is not None:
        if not isinstance(steps, int) or steps < 1:
            raise ParityError(Check.SETUP, f"steps must be an int >= 1, got {steps!r}")
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
            buffers=buffers,
            optimizer=optimizer,
            steps=steps,
            loss=loss,
            enter=enter,
            verdicts=verdicts,
        )
    return _check_step(
        cell,
        serial,
        cp,
        inputs=inputs,
        placements=placements,
        output_axes=output_axes,
        tol=tol,
        perturb=perturb,
        allow_zero=allow_zero,
        prepare_cp=prepare_cp,
        activations=activations,
        buffers=buffers,
        enter=enter,
        verdicts=verdicts,
    )


def _check_step(
    cell: Any,
    serial: torch.nn.Module | Callable[..., Any],
    cp: torch.nn.Module | Callable[..., Any],
    *,
    inputs: Mapping[str, Any],
    placements: Mapping[str, Placements] | None,
    output_axes: Mapping[str, Axes] | Axes | None,
    tol: Tolerance,
    perturb: bool,
    allow_zero: Mapping[str, str] | None,
    prepare_cp: PrepareCP | None,
    activations: Activations | None,
    buffers: BufferPlacements | None,
    enter: EnterStep,
    verdicts: Verdicts,
) -> ParityReport:
    """The step level of :func:`check_parity`: one forward and backward on each side (and
    on the fp64 twin), then every output, grad and buffer compared (steps 2-7 of the
    module docstring)."""
    warns: list[str] = []
    with recording_warnings(warns):
        perturbed: list[str] = []
        if isinstance(serial, torch.nn.Module):
            cp, perturbed, weights = load_modules(
                cell, serial, cp, perturb=perturb, prepare_cp=prepare_cp
            )
            verdicts.add(Check.SETUP, weights)
        twin = make_twin(serial) if tol.twin is not None else Twin(why="fixed")
        verdicts.lines.setdefault(Check.NONZERO, []).append(perturbed_line(perturbed, perturb))
        with odd_input_fails(Check.SETUP):
            ins = materialize(cell, inputs, placements or {})
        verdicts.lines.setdefault(Check.SETUP, []).append(_inputs_line(ins))
        t_ins, t_leaves = upcast_inputs(ins.serial, list(ins.leaves)) if twin.ok else ({}, {})
        serial_params, cp_params = named_params(serial), named_params(cp)
        check_same_names("parameters", serial_params, cp_params)
        verdicts.add(
            Check.REPLICATED_IDENTICAL,
            replicated_problems(
                {
                    **tensors_of(ins.serial, "input "),
                    **{f"param {n}": p for n, p in serial_params.items()},
                },
                cell.mesh,
            ),
        )
        s_start = buffer_copies(serial) if twin.ok else {}
        with autocast_ctx(cell):
            s_out = serial(**ins.serial)
        s_leaves = dict(flatten(s_out))
        s_grads = serial_backward(cell, s_leaves)
        with enter(ins.cp):  # the CP side's whole step: forward and backward
            with autocast_ctx(cell):
                c_out = run_cp(cp, ins)
            c_leaves = dict(flatten(c_out))
            check_same_names("outputs", s_leaves, c_leaves)
            with odd_input_fails(Check.SETUP):
                axes_of = output_axes_map(output_axes, s_leaves)
            shapes = shape_mismatches(ins, s_leaves, c_leaves, axes_of)
            if not shapes:
                cp_backward(ins, s_grads, c_leaves, axes_of, verdicts)
    record_warnings(verdicts, warns)
    if twin.ok and tol.twin is not None:
        _run_twin(twin, t_ins, t_leaves, s_grads)
        compared = {**serial_params, **s_leaves, **{n: x.serial for n, x in ins.leaves.items()}}
        parts = row_shards(ins.cp)  # the second sample only where one sample cannot judge
        sample = second_sample(serial, s_start, ins.serial, list(ins.leaves), s_leaves, s_grads,
                               twin, parts, lambda: autocast_ctx(cell)) \
            if twin.ok and parts > 1 and needs_second(compared) else None
        run_probes(twin, t_ins, list(t_leaves), s_grads, tol.twin.eps)
        if sample is not None:
            attach(twin, sample)
            verdicts.evidence["second_sample"] = sample.line()
    verdicts.evidence["twin"] = twin_line(tol, twin)

    check_sharding_active(cell, verdicts, ins, c_leaves, cp, cp_params, activations)
    _check_outputs(cell, verdicts, ins, s_leaves, c_leaves, axes_of, twin, tol)

    if shapes:
        skip_grads_for_shapes(verdicts, shapes)
        verdicts.add(Check.NONZERO, grad_problems(_serial_values(s_leaves), allow_zero=allow_zero))
        return finish(cell, verdicts, tol, perturbed)
    with odd_input_fails(Check.SETUP):
        plan = plan_buffers(buffers, named_buffers(cp), cell.mesh)
    _check_grads(cell, verdicts, ins, serial, cp, serial_params, cp_params, s_leaves, twin, tol,
                 allow_zero, plan)
    return finish(cell, verdicts, tol, perturbed)


def _run_twin(twin: Twin, t_ins: Mapping[str, Any], t_leaves: Mapping[str, torch.Tensor],
              s_grads: Mapping[str, torch.Tensor]) -> None:
    """Step 5: the serial side again in fp64 on the upcast inputs, backward with the serial
    side's grad_outputs; keeps its outputs, input and parameter grads and buffers on
    ``twin`` (the reference the low-precision values are judged against)."""
    with twin.running():
        t_out = outputs_of(twin.module(**t_ins))
        backward_twin(t_out, s_grads)
        twin.outputs = {n: v.detach() for n, v in t_out.items()
                        if isinstance(v, torch.Tensor)}
        twin.input_grads = {n: t.grad for n, t in t_leaves.items()}
        twin.param_grads = {n: p.grad for n, p in named_params(twin.module).items()}
        twin.buffers = buffer_copies(twin.module)


def _check_outputs(
    cell: Any, verdicts: Verdicts, ins: Inputs, s_leaves: Mapping[str, Any],
    c_leaves: Mapping[str, Any], axes_of: Mapping[str, Axes], twin: Twin, tol: Tolerance,
) -> None:
    """Every CP output (``full_tensor()``, laid out as the serial one) against the serial
    one and the twin's, and identical on the ranks that hold it replicated."""
    compare_outputs(verdicts, ins, s_leaves, c_leaves, axes_of, twin.outputs, tol)
    verdicts.add(Check.REPLICATED_IDENTICAL,
                 replicated_problems(tensors_of(c_leaves, ""), cell.mesh))


def _check_grads(
    cell: Any, verdicts: Verdicts, ins: Inputs, serial: Any, cp: Any,
    serial_params: Mapping[str, torch.Tensor], cp_params: Mapping[str, torch.Tensor],
    s_leaves: Mapping[str, Any], twin: Twin, tol: Tolerance,
    allow_zero: Mapping[str, str] | None, plan: list[PartialBuffer],
) -> None:
    """After backward: every input grad, parameter grad and buffer against the serial side
    (and the twin); grads placed and replicated as they should be, non-zero and finite."""
    if not ins.leaves:
        verdicts.skipped.setdefault(
            Check.INPUT_GRAD,
            "no input takes a gradient (only integer inputs, requires_grad=False, or none)")
    with odd_input_fails(Check.INPUT_GRAD):
        input_pairs = {n: (serial_layout(ins, leaf.cp.grad, leaf.axes), leaf.serial.grad,
                           twin.input_grads.get(n))
                       for n, leaf in ins.leaves.items()}
    verdicts.add_diffs(Check.INPUT_GRAD, compare_named(input_pairs, tol), tol)
    input_grads = {n: leaf.cp.grad for n, leaf in ins.leaves.items() if leaf.cp.grad is not None}
    verdicts.check_placements({f"grad {n}": g for n, g in input_grads.items()}, cell.mesh)
    if input_grads:
        verdicts.add(Check.INPUT_GRAD, replicated_problems(input_grads, cell.mesh))
    check_param_grads(verdicts, serial_params, cp_params, tol, cell.mesh, twin.param_grads)
    verdicts.lines.setdefault(Check.BUFFER, []).extend(b.line() for b in plan)
    check_buffers(verdicts, named_buffers(serial), reduced(named_buffers(cp), plan, cell.mesh),
                  tol, twin.buffers)
    verdicts.add(
        Check.NONZERO,
        grad_problems(
            {
                **_serial_values(s_leaves),
                **{f"grad {n}": leaf.serial.grad for n, leaf in ins.leaves.items()},
                **{f"grad {n}": p.grad for n, p in serial_params.items()},
            },
            allow_zero=allow_zero,
        ),
    )


def _serial_values(s_leaves: Mapping[str, Any]) -> dict[str, Any]:
    return {n: s.detach() for n, s in s_leaves.items()
            if isinstance(s, torch.Tensor) and s.is_floating_point()}


def _inputs_line(ins: Inputs) -> str:
    shapes = [f"{n} {tuple(v.shape)}" for n, v in tensors_of(ins.serial, "").items()]
    return "inputs from cell.generator: " + ", ".join(shapes)


def serial_backward(cell: Any, s_leaves: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Backward the serial side with one random grad_output per differentiable output
    (drawn from ``cell.generator`` in output order); the grads by output name."""
    grads: dict[str, torch.Tensor] = {}
    for name, s in s_leaves.items():
        if isinstance(s, torch.Tensor) and s.requires_grad:
            grads[name] = draw(cell.generator, s.shape, s.dtype, s.device)
    if grads:
        torch.autograd.backward([s_leaves[n] for n in grads], list(grads.values()))
    return grads


def cp_backward(
    ins: Inputs,
    s_grads: Mapping[str, torch.Tensor],
    c_leaves: Mapping[str, Any],
    axes_of: Mapping[str, Axes],
    verdicts: Verdicts,
) -> None:
    """Backward the CP side with the serial side's grad_outputs, laid out and placed as
    each CP output is (a ``Partial`` output's grad is replicated)."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    c_outs: list[Any] = []
    c_grads: list[Any] = []
    for name, g in s_grads.items():
        c = c_leaves[name]
        if not (isinstance(c, torch.Tensor) and c.requires_grad):
            verdicts.add(
                Check.OUTPUT,
                CheckOutcome(
                    problems=[
                        f"{name}: serial output is differentiable, the CP one is not (detached?)"
                    ]
                ),
            )
            continue
        axes = axes_of.get(name)
        full = ins.batch.layout.to_cp(g, axes) if axes is not None and ins.batch else g
        c_outs.append(c)
        if is_dtensor(c):
            dt: Any = c
            places = [Replicate() if p.is_partial() else p for p in dt.placements]
            c_grads.append(distribute_tensor(full, dt.device_mesh, places, src_data_rank=None))
        else:
            c_grads.append(full.clone())
    if not s_grads:
        verdicts.skipped[Check.INPUT_GRAD] = "no differentiable output"
        verdicts.skipped[Check.PARAM_GRAD] = "no differentiable output"
        return
    if c_outs:
        torch.autograd.backward(c_outs, c_grads)
