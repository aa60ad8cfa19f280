"""Compare CP values with serial ones: every tensor, by name, with its max abs/rel diff.

``torch.testing.assert_close`` stops at the first bad tensor and says little about the
rest. A CP bug usually breaks several tensors at once, and *which* ones break is the
diagnosis (output fine, one parameter's grad wrong: a missing all-reduce). So this module
compares a whole named set and reports every mismatch, with the same criterion as
``assert_close``: ``|actual - expected| <= atol + rtol * |expected|``, NaN never equal.

Example::

    >>> import torch
    >>> from cpmatrix.parity.tolerance import tolerance_for
    >>> diffs = compare_named({"y": (torch.ones(3), torch.ones(3))}, tolerance_for("fp32"))
    >>> diffs[0].ok, diffs[0].max_abs
    (True, 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cpmatrix.parity.errors import odd_input_fails
from cpmatrix.parity.tolerance import Tolerance

__all__ = ["Diff", "compare_named", "flatten", "format_diffs", "to_full"]


def to_full(value: Any) -> Any:
    """A DTensor's global value (``full_tensor()``, which also reduces ``Partial``); else as is.

    ``to_local()`` would be only this rank's piece (or, for a ``Partial`` grad, only this
    rank's contribution), which is exactly the mistake a parity test must not make.
    """
    full_tensor = getattr(value, "full_tensor", None)
    if callable(full_tensor):
        return full_tensor()
    return value


def flatten(value: Any, prefix: str = "out") -> Iterator[tuple[str, Any]]:
    """Leaves of nested tuples/lists/dicts with dotted names: ``out``, ``out.0``, ``out.key``.

    Example::

        >>> [name for name, _ in flatten({"a": 1, "b": (2, 3)})]
        ['out.a', 'out.b.0', 'out.b.1']
    """
    if isinstance(value, Mapping):
        for key in value:
            yield from flatten(value[key], f"{prefix}.{key}")
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from flatten(item, f"{prefix}.{i}")
    else:
        yield prefix, value


@dataclass(frozen=True, slots=True)
class Diff:
    """One tensor's comparison. ``max_rel`` is over elements whose expected value is non-zero."""

    name: str
    ok: bool
    max_abs: float
    max_rel: float
    bad: int
    numel: int
    note: str = ""

    def line(self) -> str:
        text = (
            f"{self.name}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, "
            f"{self.bad}/{self.numel} outside"
        )
        return f"{text} ({self.note})" if self.note else text


def _diff(name: str, actual: Any, expected: Any, tol: Tolerance) -> Diff:
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return _leaf_diff(name, actual, expected)
    if actual.shape != expected.shape:
        note = f"shape {tuple(actual.shape)} != serial {tuple(expected.shape)}"
        return Diff(
            name, False, math.inf, math.inf, expected.numel(), expected.numel(), note
        )
    numel = expected.numel()
    note = (
        "" if actual.dtype == expected.dtype else f"dtype {actual.dtype} != serial {expected.dtype}"
    )
    if numel == 0:  # nothing to differ, but the shape (above) and dtype must still agree
        return Diff(name, not note, 0.0, 0.0, 0, 0, note)
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if _exact(a) and _exact(e):
        # integers and bools: exact, in their own dtype (int64 beyond 2**53 has no float64
        # twin), as assert_close does for them
        bad_mask = a != e
        # the evidence (max abs/rel) in float64, from the exact int64 difference
        abs_diff = (a.to(torch.int64) - e.to(torch.int64)).abs().double()
        e = e.double()
    else:
        # float64, or complex128 when either side is complex (its imaginary part counts)
        wide = torch.promote_types(torch.promote_types(a.dtype, e.dtype), torch.float64)
        a, e = (t.to(wide) for t in (a, e))
        # assert_close's criterion where both are finite. Elsewhere only equality: equal
        # infs (same sign) match; NaN never does (a NaN on both sides is two broken
        # results, not a match), and an inf never fits inside `atol + rtol * |inf|`.
        equal = a == e
        finite = torch.isfinite(a) & torch.isfinite(e)
        abs_diff = torch.where(equal, 0.0, (a - e).abs())
        bad_mask = ~(equal | (finite & (abs_diff <= tol.atol + tol.rtol * e.abs())))
    nonzero = e != 0
    rel = abs_diff[nonzero] / e.abs()[nonzero]
    max_abs = _worst(abs_diff)
    max_rel = _worst(rel) if rel.numel() else 0.0
    bad = int(bad_mask.sum())
    return Diff(name, bad == 0 and not note, max_abs, max_rel, bad, numel, note)


def _worst(values: torch.Tensor) -> float:
    """The largest value, NaN counted as inf (nan_to_num alone would turn inf into 1.8e308)."""
    return float(torch.nan_to_num(values, nan=math.inf, posinf=math.inf).max())


def _exact(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex())


def _leaf_diff(name: str, actual: Any, expected: Any) -> Diff:
    """A leaf that is not a tensor on both sides: equal values or a mismatch that says why.

    ``None`` on one side is a missing value; a tensor against a non-tensor is a type
    mismatch; anything else (ints, floats, strings, ``None`` on both sides) is compared
    with ``==``, exactly (a float NaN is never equal, as in a tensor).
    """
    if (actual is None) != (expected is None):
        missing = "CP" if actual is None else "serial"
        return Diff(
            name, False, math.inf, math.inf, 0, 0, f"missing on the {missing} side"
        )
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        note = f"{type(actual).__name__} != serial {type(expected).__name__}"
        return Diff(name, False, math.inf, math.inf, 1, 1, note)
    try:
        same = bool(actual == expected)
    except (TypeError, ValueError, RuntimeError):  # e.g. arrays: no single truth value
        same = False
    note = "" if same else f"{actual!r} != {expected!r}"
    return Diff(name, same, 0.0 if same else math.inf, 0.0, int(not same), 1, note)


def compare_named(pairs: Mapping[str, tuple[Any, Any]], tol: Tolerance) -> list[Diff]:
    """One :class:`Diff` per name, ``pairs[name] = (actual_cp, expected_serial)``.

    DTensors are reassembled with :func:`to_full` first. Nothing raises for values that
    differ: the caller decides which check the mismatches belong to; ``pairs`` that are not
    a mapping of ``(cp, serial)`` pairs fail ``setup``.
    """
    with odd_input_fails("setup"):
        named = [(name, a, e) for name, (a, e) in pairs.items()]
    full = [(name, to_full(a), to_full(e)) for name, a, e in named]  # collectives: outside
    with odd_input_fails("setup"):
        return [_diff(name, a, e, tol) for name, a, e in full]


def format_diffs(check: str, diffs: list[Diff], tol: Tolerance) -> str:
    """A block listing every mismatching tensor of one check (for the error message)."""
    bad = [d for d in diffs if not d.ok]
    head = f"{check}: {len(bad)} of {len(diffs)} tensors differ from serial ({tol.describe()})"
    return "\n".join([head, *(f"  {d.line()}" for d in bad)])
