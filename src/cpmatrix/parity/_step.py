"""The CP side's step in :func:`check_parity`: its context, its errors, its output shapes.

- :func:`cp_context` - ``context=`` (``loss_parallel`` and the like) entered around the CP
  side's whole step: forward, loss and backward, as a training loop runs them. A context
  entered around the loss alone (``loss_parallel`` in particular) leaves the backward
  mixing ``Tensor`` and ``DTensor``.
- :func:`run_cp` - the CP forward; an exception of it stays the model's own, with a note
  when an input went in with the default placement (a replicated DTensor) that the model
  may not expect (integer token ids for a TP plan that distributes them itself).
- :func:`check_sharding_active` - the CP step's inputs, outputs, sharded parameters and
  buffers, and the activations the case declares: at least one must be sharded.
- :func:`compare_outputs` - every CP output, laid out as the serial one, against the
  serial one and the twin's.
- :func:`shape_mismatches` - a CP output of the wrong shape fails ``output`` in one line,
  and no grad_output fits it: the grad checks are skipped with that reason instead of
  listing every parameter grad as missing.

Private: cases use :mod:`cpmatrix.parity`'s public names only.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from cpmatrix.parity._inputs import (
    Axes,
    Inputs,
    default_placement_note,
    serial_layout,
    tensors_of,
)
from cpmatrix.parity._report import Verdicts
from cpmatrix.parity._twin import Twin
from cpmatrix.parity._weights import sharded_state
from cpmatrix.parity.compare import compare_named
from cpmatrix.parity.errors import Check, ParityError, odd_input_fails
from cpmatrix.parity.tolerance import Tolerance

__all__ = [
    "ContextFactory",
    "EnterStep",
    "check_sharding_active",
    "compare_outputs",
    "cp_context",
    "run_cp",
    "shape_mismatches",
    "skip_grads_for_shapes",
    "twin_line",
]

#: ``context=``: a factory of a context manager, entered once per CP step: with no
#: argument (``loss_parallel``), or with the CP side's inputs of the step (``lambda ins:
#: context_parallel(mesh, buffers=[ins["x"]], buffer_seq_dims=[1])``).
ContextFactory = Callable[..., contextlib.AbstractContextManager[Any]]
#: What :func:`cp_context` makes of it: called with the step's CP inputs either way.
EnterStep = Callable[[Mapping[str, Any]], contextlib.AbstractContextManager[Any]]


def _takes_inputs(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes one positional argument (the step's CP inputs)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called without one
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is p.empty]
    return len(positional) == 1 or any(p.kind is p.VAR_POSITIONAL for p in params)


def cp_context(context: Any) -> EnterStep:
    """``context`` checked: a callable returning a context manager (a fresh one per step),
    called with the CP side's inputs of the step when it takes one argument.

    >>> cp_context(None)({}).__class__.__name__
    'nullcontext'
    >>> cp_context(lambda ins: contextlib.nullcontext(ins["x"]))({"x": 1}).__enter__()
    1
    >>> cp_context(contextlib.nullcontext())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    cpmatrix.parity.errors.ParityError: context must be a factory of a context manager, ...
    """
    if context is None:
        return lambda _inputs: contextlib.nullcontext()
    if not callable(context):
        raise ParityError(Check.SETUP, f"context must be a factory of a context manager, called "
                                   f"once per CP step (context=loss_parallel, not "
                                   f"context=loss_parallel()); got a {type(context).__name__}")

    with_inputs = _takes_inputs(context)

    def enter(inputs: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
        made = context(inputs) if with_inputs else context()
        if not (hasattr(made, "__enter__") and hasattr(made, "__exit__")):
            raise ParityError(Check.SETUP, f"context() must return a context manager, got a "
                                       f"{type(made).__name__}")
        return made  # type: ignore[no-any-return]

    return enter


def run_cp(cp: Any, ins: Inputs) -> Any:
    """The CP forward; its exception stays its own, noting inputs nobody placed."""
    try:
        return cp(**ins.cp)
    except Exception as exc:
        if ins.defaulted:
            exc.add_note(default_placement_note(ins.defaulted))
        raise


def check_sharding_active(
    cell: Any, verdicts: Verdicts, ins: Inputs, c_leaves: Mapping[str, Any], cp: Any,
    cp_params: Mapping[str, torch.Tensor], activations: Callable[[], Mapping[str, Any]] | None,
) -> None:
    """``sharding_active`` over what the CP step touched: its inputs and outputs, the CP
    module's sharded parameters and buffers, and what ``activations()`` declares."""
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


def compare_outputs(
    verdicts: Verdicts, ins: Inputs, s_leaves: Mapping[str, Any], c_leaves: Mapping[str, Any],
    axes_of: Mapping[str, Axes], twin_outputs: Mapping[str, Any], tol: Tolerance,
) -> None:
    """Every CP output (``full_tensor()``, laid out as the serial one) against the serial
    one and the twin's (``twin_outputs``: empty when there is no usable twin)."""
    with odd_input_fails(Check.OUTPUT):  # a CP output that does not fit its axes fails here
        outputs = {n: (serial_layout(ins, c_leaves[n], axes_of.get(n)), s, twin_outputs.get(n))
                   for n, s in s_leaves.items()}
    verdicts.add_diffs(Check.OUTPUT, compare_named(outputs, tol), tol)


def shape_mismatches(
    ins: Inputs, s_leaves: Mapping[str, Any], c_leaves: Mapping[str, Any],
    axes_of: Mapping[str, Axes],
) -> list[str]:
    """``name: CP shape != serial shape`` for every differentiable output whose CP value
    (a DTensor by its global shape, in the CP layout) cannot take the serial grad_output."""
    out = []
    for name, s in s_leaves.items():
        c = c_leaves.get(name)
        if not (isinstance(s, torch.Tensor) and s.requires_grad and isinstance(c, torch.Tensor)):
            continue
        axes = axes_of.get(name)
        want = tuple(s.shape)
        if axes is not None and ins.batch is not None:
            want = tuple(ins.batch.layout.to_cp(s.detach(), axes).shape)
        if tuple(c.shape) != want:
            out.append(f"{name}: CP shape {tuple(c.shape)} != serial {want}")
    return out


def skip_grads_for_shapes(verdicts: Verdicts, shapes: list[str]) -> None:
    """The grad checks skipped (not failed) when an output's shape is wrong: ``output``
    already failed on it, and a grad check without a backward would only list every grad
    as missing."""
    why = (f"no CP backward ran: the CP output's shape is wrong ({'; '.join(shapes)}), "
           f"so no grad_output fits it (see output)")
    for check in (Check.INPUT_GRAD, Check.PARAM_GRAD, Check.BUFFER):
        verdicts.skipped[check] = why


def twin_line(tol: Tolerance, twin: Twin) -> str:
    """The evidence ``<label>.twin``: whether the fp64 twin ran, or why the table judged."""
    if tol.twin is None:
        return "none: a fixed tolerance (fp64 cell, or one given) judges every tensor"
    if twin.ok:
        probes = (", and four times more with its inputs and every module's outputs moved by "
                  "+/- a rounding-sized step (the probes: what flips is judged apart)"
                  if twin.probed else f"; {twin.probe_why}" if twin.probe_why else "")
        return "ran: the serial side again in float64 on the same weights and inputs" + probes
    return f"could not run, the fixed table judged instead: {twin.why}"
