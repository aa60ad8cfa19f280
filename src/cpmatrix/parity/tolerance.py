"""The one tolerance table, keyed by (dtype, autocast, path), and the loosening rule.

A CP implementation and its serial twin run the same math in a different order, so they
differ by rounding only. The table says how much rounding each cell's dtype allows. A case
may loosen its row only with a written reason; the reason lands in the report, because
needing a looser tolerance is itself a bug signal (seed rule 15: derive it from the error
budget, never tune it until green).

Example::

    >>> tol = tolerance_for("fp64")
    >>> (tol.rtol, tol.atol)
    (1e-07, 1e-07)
    >>> looser = tol.loosen(atol=1e-6, reason="sums 1e6 terms; error budget is n*eps*max|x|")
    >>> resolve_tolerance(looser, dtype="fp64").atol
    1e-06
    >>> resolve_tolerance(Tolerance(rtol=1e-3, atol=1e-3), dtype="fp64")
    Traceback (most recent call last):
    ...
    cpmatrix.parity.errors.ToleranceError: tolerance rtol=0.001, atol=0.001 is looser than ...
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from cpmatrix.parity.errors import ToleranceError

__all__ = [
    "TOLERANCE_TABLE",
    "TWIN_FACTOR",
    "TWIN_FLOOR_ULPS",
    "Tolerance",
    "TwinRule",
    "dtype_name",
    "resolve_tolerance",
    "table_markdown",
    "tolerance_for",
]

#: Smallest reason accepted: a sentence, not "flaky" or "tbd".
MIN_REASON_WORDS: Final = 3
MIN_REASON_CHARS: Final = 12

_DTYPE_ALIASES: Final = {
    "fp64": "fp64",
    "float64": "fp64",
    "double": "fp64",
    "torch.float64": "fp64",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
}


#: The fp64 twin rule's factor and floor (derivation: docs/parity.md, "The fp64 twin").
TWIN_FACTOR: Final = 4.0
TWIN_FLOOR_ULPS: Final = 4.0

#: Machine epsilon (spacing at 1.0) of the precision a cell really computes in.
_EPS: Final = {"fp32": 2.0**-23, "tf32": 2.0**-10, "bf16": 2.0**-7, "fp16": 2.0**-10}


@dataclass(frozen=True, slots=True, kw_only=True)
class TwinRule:
    """The fp64 twin rule: the CP side's error against the serial model re-run in fp64
    (the twin) may be at most ``factor`` times the serial side's own error against it,
    plus a floor of ``floor_ulps`` ulps (of ``precision``) at the value's scale::

        |cp_i - twin_i| <= factor * max_j |serial_j - twin_j| + floor_ulps * eps * max_j |twin_j|

    Example::

        >>> rule = tolerance_for("bf16").twin
        >>> rule.budget(serial_err=0.01, scale=2.0)  # 4 x 0.01 + 4 x 2^-7 x 2
        0.10250000000000001
        >>> rule.describe()
        'fp64 twin: |cp - twin| <= 4 x max|serial - twin| + 4 ulp (bf16, eps 2^-7) x max|twin|'
    """

    factor: float
    floor_ulps: float
    #: The precision the cell computes in: fp32, tf32 (Triton's fp32 dot), bf16, fp16.
    precision: str

    @property
    def eps(self) -> float:
        return _EPS[self.precision]

    def floor(self, scale: float) -> float:
        """The allowance where the serial side happens to be exact: a few ulps at ``scale``."""
        return self.floor_ulps * self.eps * scale

    def budget(self, *, serial_err: float, scale: float) -> float:
        return self.factor * serial_err + self.floor(scale)

    def describe(self) -> str:
        exponent = round(math.log2(self.eps))
        return (f"fp64 twin: |cp - twin| <= {self.factor:g} x max|serial - twin| + "
                f"{self.floor_ulps:g} ulp ({self.precision}, eps 2^{exponent}) x max|twin|")


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance:
    """``rtol``/``atol`` as in ``torch.testing.assert_close``, with where they came from.

    ``why`` says why a table row has these numbers; ``reason`` is the written reason of a
    loosening (None for a table row). Build a looser one with :meth:`loosen`.

    ``twin``: the fp64 twin rule of an fp32/bf16/fp16 row (:class:`TwinRule`). Where it is
    set, every floating tensor is judged by it, and ``rtol``/``atol`` are the fixed row
    used only where no twin value exists (the evidence then says "table"). fp64 rows and
    tolerances built by hand have no twin: the fixed rule judges everything.

    Example::

        >>> tolerance_for("fp64").describe()
        'rtol=1e-07, atol=1e-07 (table fp64/off/reference)'
        >>> tolerance_for("bf16").describe()[:48]
        'fp64 twin: |cp - twin| <= 4 x max|serial - twin|'
    """

    rtol: float
    atol: float
    why: str = ""
    source: str = "custom"
    reason: str | None = None
    twin: TwinRule | None = None

    def loosen(
        self,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        factor: float | None = None,
        reason: str,
    ) -> Tolerance:
        """A looser copy; refused (ToleranceError) without a reason.

        ``factor`` loosens the fp64 twin rule (only where there is one). ``rtol``/``atol``
        make a *fixed* tolerance: the twin rule is dropped, and every tensor is judged by
        ``|cp - serial| <= atol + rtol * |serial|`` (say in the reason why the twin's
        budget does not fit).
        """
        _require_reason(reason, f"loosening {self.describe()}")
        twin = self.twin
        if factor is not None:
            if twin is None:
                raise ToleranceError(
                    f"loosen(factor=...) needs an fp64 twin rule; {self.describe()} is fixed: "
                    f"loosen rtol/atol instead")
            twin = TwinRule(factor=float(factor), floor_ulps=twin.floor_ulps,
                            precision=twin.precision)
        if rtol is not None or atol is not None:
            twin = None
        new = Tolerance(
            rtol=self.rtol if rtol is None else float(rtol),
            atol=self.atol if atol is None else float(atol),
            why=self.why,
            source=f"loosened from {self.source}",
            reason=reason.strip(),
            twin=twin,
        )
        _require_valid_numbers(new)
        return new

    def is_looser_than(self, other: Tolerance) -> bool:
        """Looser fixed numbers, or a twin factor/floor above ``other``'s.

        Dropping the twin for a fixed tolerance is judged by the fixed numbers alone (the
        fixed table row is what a cell without a twin gets anyway).
        """
        if self.rtol > other.rtol or self.atol > other.atol:
            return True
        mine, theirs = self.twin, other.twin
        if mine is None or theirs is None:
            return False
        return (mine.factor > theirs.factor or mine.floor_ulps > theirs.floor_ulps
                or mine.eps > theirs.eps)

    def describe(self) -> str:
        fixed = f"rtol={self.rtol:.3g}, atol={self.atol:.3g} ({self.source})"
        text = (fixed if self.twin is None
                else f"{self.twin.describe()}; where no twin: {fixed}")
        if self.reason:
            text += f"; reason: {self.reason}"
        return text


_DEFAULT64 = "torch.testing.assert_close defaults for float64"
_NO_AUTOCAST64 = "autocast never casts float64 tensors, so the math stays fp64: float64 defaults"
_DEFAULT32 = "torch.testing.assert_close defaults for float32"
_TF32 = (
    "Triton's tl.dot rounds fp32 inputs to TF32 by default (eps 2**-10 = 9.8e-4); "
    "2 eps, absolute at the toolkit's O(1) inputs"
)
_AUTOCAST32 = (
    "autocast computes matmuls in bf16 on CPU (fp16 on CUDA, tighter): the bf16 row "
    "applies even though tensors stay fp32"
)
_BF16 = (
    "assert_close's bf16 rtol (2 eps); its atol=1e-5 is below one bf16 ulp at 1.0 "
    "(7.8e-3), and a different reduction order near a cancellation is ~2 ulp absolute "
    "at the toolkit's O(1) inputs"
)
_FP16 = (
    "assert_close's fp16 rtol; atol = 2 fp16 ulp at 1.0 (2 * 9.8e-4) for the same "
    "reduction-order reason as bf16"
)

#: The precision each (dtype, autocast on?, path) computes in, for the twin rule's floor:
#: autocast computes in bf16 on CPU; Triton's fp32 tl.dot in TF32. fp64: no twin.
_COMPUTE: Final = {
    ("fp32", False, "reference"): "fp32", ("fp32", True, "reference"): "bf16",
    ("fp32", False, "kernel"): "tf32", ("fp32", True, "kernel"): "bf16",
    ("bf16", False, "reference"): "bf16", ("bf16", True, "reference"): "bf16",
    ("bf16", False, "kernel"): "bf16", ("bf16", True, "kernel"): "bf16",
    ("fp16", False, "reference"): "fp16", ("fp16", True, "reference"): "fp16",
    ("fp16", False, "kernel"): "fp16", ("fp16", True, "kernel"): "fp16",
}

#: The rows: (dtype, autocast on?, path, rtol, atol, why).
_ROWS: Final = (
    ("fp64", False, "reference", 1e-7, 1e-7, _DEFAULT64),
    ("fp64", True, "reference", 1e-7, 1e-7, _NO_AUTOCAST64),
    ("fp64", False, "kernel", 1e-7, 1e-7, _DEFAULT64),
    ("fp64", True, "kernel", 1e-7, 1e-7, _NO_AUTOCAST64),
    ("fp32", False, "reference", 1.3e-6, 1e-5, _DEFAULT32),
    ("fp32", True, "reference", 1.6e-2, 1.6e-2, _AUTOCAST32),
    ("fp32", False, "kernel", 2e-3, 2e-3, _TF32),
    ("fp32", True, "kernel", 1.6e-2, 1.6e-2, _AUTOCAST32),
    ("bf16", False, "reference", 1.6e-2, 1.6e-2, _BF16),
    ("bf16", True, "reference", 1.6e-2, 1.6e-2, _BF16),
    ("bf16", False, "kernel", 1.6e-2, 1.6e-2, _BF16),
    ("bf16", True, "kernel", 1.6e-2, 1.6e-2, _BF16),
    ("fp16", False, "reference", 1e-3, 2e-3, _FP16),
    ("fp16", True, "reference", 1e-3, 2e-3, _FP16),
    ("fp16", False, "kernel", 1e-3, 2e-3, _FP16),
    ("fp16", True, "kernel", 1e-3, 2e-3, _FP16),
)

#: THE table. Keys: (dtype name, autocast on?, path). Values: :class:`Tolerance` with ``why``.
#: Built inline at import (no helper function), so what a test sees is what every cell gets.
#: Rows of fp32/bf16/fp16 carry the fp64 twin rule (:class:`TwinRule`); their rtol/atol
#: judge only what has no twin value. fp64 rows are fixed.
TOLERANCE_TABLE: Final[Mapping[tuple[str, bool, str], Tolerance]] = MappingProxyType({
    (dtype, autocast, path): Tolerance(
        rtol=rtol, atol=atol, why=why,
        source=f"table {dtype}/{'on' if autocast else 'off'}/{path}",
        twin=None if dtype == "fp64" else TwinRule(
            factor=TWIN_FACTOR, floor_ulps=TWIN_FLOOR_ULPS,
            precision=_COMPUTE[(dtype, autocast, path)]),
    )
    for dtype, autocast, path, rtol, atol, why in _ROWS
})


def dtype_name(dtype: Any) -> str:
    """``torch.float64`` / ``"float64"`` / ``"fp64"`` -> ``"fp64"`` (ValueError otherwise)."""
    name = _DTYPE_ALIASES.get(str(dtype))
    if name is None:
        allowed = ", ".join(sorted({v for v in _DTYPE_ALIASES.values()}))
        raise ValueError(f"no tolerance row for dtype {dtype!r} (allowed: {allowed})")
    return name


def _autocast_flag(autocast: bool | str) -> bool:
    if isinstance(autocast, str):
        if autocast not in ("on", "off"):
            raise ValueError(f"autocast must be a bool or 'on'/'off', got {autocast!r}")
        return autocast == "on"
    return bool(autocast)


def tolerance_for(dtype: Any, autocast: bool | str = False, path: str = "reference") -> Tolerance:
    """The table row for a cell: ``tolerance_for(cell.dtype, cell.autocast, cell.path)``.

    Example::

        >>> tolerance_for("fp32", autocast=True).rtol
        0.016
    """
    key = (dtype_name(dtype), _autocast_flag(autocast), path)
    try:
        return TOLERANCE_TABLE[key]
    except KeyError:
        raise ValueError(
            f"no tolerance row for path {path!r} (allowed: reference, kernel)"
        ) from None


def resolve_tolerance(
    requested: Tolerance | None,
    *,
    dtype: Any,
    autocast: bool | str = False,
    path: str = "reference",
) -> Tolerance:
    """The tolerance a check uses: the table row, or ``requested`` if it is allowed.

    ``requested`` may be tighter than the row freely; looser only with a written reason
    (made by :meth:`Tolerance.loosen`), else :class:`ToleranceError`. A requested
    tolerance without a twin rule is a fixed one: it judges every tensor by its numbers.
    """
    base = tolerance_for(dtype, autocast, path)
    if requested is None:
        return base
    _require_valid_numbers(requested)
    if requested.is_looser_than(base) and not _reason_ok(requested.reason):
        raise ToleranceError(
            f"tolerance rtol={requested.rtol:.3g}, atol={requested.atol:.3g} is looser than "
            f"the {base.source} row (rtol={base.rtol:.3g}, atol={base.atol:.3g}) and has no "
            f"written reason; use tolerance_for(...).loosen(atol=..., reason='why the error "
            f"budget is larger'), or find the bug (a looser tolerance is a bug signal)"
        )
    return requested


def table_markdown() -> str:
    """The table as Markdown (the README shows exactly this; a test keeps them in sync)."""
    lines = ["| dtype | autocast | path | default rule | fixed rtol | fixed atol | why |",
             "|---|---|---|---|---|---|---|"]
    for (dtype, autocast, path), tol in TOLERANCE_TABLE.items():
        on = "on" if autocast else "off"
        rule = "fixed" if tol.twin is None else f"fp64 twin ({tol.twin.precision} ulp)"
        lines.append(f"| {dtype} | {on} | {path} | {rule} | {tol.rtol:g} | {tol.atol:g} "
                     f"| {tol.why} |")
    return "\n".join(lines) + "\n"


def _reason_ok(reason: object) -> bool:
    if not isinstance(reason, str):
        return False
    text = reason.strip()
    return len(text) >= MIN_REASON_CHARS and len(text.split()) >= MIN_REASON_WORDS


def _require_reason(reason: object, what: str) -> None:
    if not _reason_ok(reason):
        raise ToleranceError(
            f"{what} needs a written reason (at least {MIN_REASON_WORDS} words, "
            f"{MIN_REASON_CHARS} characters), got {reason!r}: say why the error budget is larger"
        )


def _require_valid_numbers(tol: Tolerance) -> None:
    values = [("rtol", tol.rtol), ("atol", tol.atol)]
    if tol.twin is not None:
        values += [("twin factor", tol.twin.factor), ("twin floor_ulps", tol.twin.floor_ulps)]
        if tol.twin.precision not in _EPS:
            raise ToleranceError(f"twin precision must be one of {sorted(_EPS)}, "
                                 f"got {tol.twin.precision!r}")
    for name, value in values:
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ToleranceError(f"tolerance {name} must be a finite number >= 0, got {value!r}")
