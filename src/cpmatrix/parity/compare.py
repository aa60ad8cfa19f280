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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

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
        if actual is None or expected is None:
            missing = "CP" if actual is None else "serial"
            return Diff(
                name, False, float("inf"), float("inf"), 0, 0, f"missing on the {missing} side"
            )
        same = bool(actual == expected)
        note = "" if same else f"{actual!r} != {expected!r}"
        return Diff(name, same, 0.0 if same else float("inf"), 0.0, int(not same), 1, note)
    if actual.shape != expected.shape:
        note = f"shape {tuple(actual.shape)} != serial {tuple(expected.shape)}"
        return Diff(
            name, False, float("inf"), float("inf"), expected.numel(), expected.numel(), note
        )
    numel = expected.numel()
    note = (
        "" if actual.dtype == expected.dtype else f"dtype {actual.dtype} != serial {expected.dtype}"
    )
    if numel == 0:
        return Diff(name, not note, 0.0, 0.0, 0, 0, note)
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if not expected.is_floating_point() and not expected.is_complex():
        # integers and bools: exact, as assert_close does for them
        bad_mask = a != e
        abs_diff = (a - e).abs()
    else:
        abs_diff = (a - e).abs()
        # +/-inf must match exactly (inf - inf is nan); NaN is never equal, as in
        # assert_close's default (a NaN on both sides is two broken results, not a match).
        same_inf = torch.isinf(e) & (a == e)
        abs_diff = torch.where(same_inf, torch.zeros_like(abs_diff), abs_diff)
        allowed = tol.atol + tol.rtol * e.abs()
        inf_mismatch = (torch.isinf(a) | torch.isinf(e)) & (a != e)
        bad_mask = (~(abs_diff <= allowed) & ~same_inf) | inf_mismatch
    nonzero = e != 0
    rel = abs_diff[nonzero] / e.abs()[nonzero]
    max_abs = float(torch.nan_to_num(abs_diff, nan=float("inf")).max())
    max_rel = float(torch.nan_to_num(rel, nan=float("inf")).max()) if rel.numel() else 0.0
    bad = int(bad_mask.sum())
    return Diff(name, bad == 0 and not note, max_abs, max_rel, bad, numel, note)


def compare_named(pairs: Mapping[str, tuple[Any, Any]], tol: Tolerance) -> list[Diff]:
    """One :class:`Diff` per name, ``pairs[name] = (actual_cp, expected_serial)``.

    DTensors are reassembled with :func:`to_full` first. Nothing raises here: the caller
    decides which check the mismatches belong to.
    """
    return [_diff(name, to_full(a), to_full(e), tol) for name, (a, e) in pairs.items()]


def format_diffs(check: str, diffs: list[Diff], tol: Tolerance) -> str:
    """A block listing every mismatching tensor of one check (for the error message)."""
    bad = [d for d in diffs if not d.ok]
    head = f"{check}: {len(bad)} of {len(diffs)} tensors differ from serial ({tol.describe()})"
    return "\n".join([head, *(f"  {d.line()}" for d in bad)])
