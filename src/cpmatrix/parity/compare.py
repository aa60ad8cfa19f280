"""Compare CP values with serial ones: every tensor, by name, with its max abs/rel diff.

``torch.testing.assert_close`` stops at the first bad tensor and says little about the
rest. A CP bug usually breaks several tensors at once, and *which* ones break is the
diagnosis (output fine, one parameter's grad wrong: a missing all-reduce). So this module
compares a whole named set and reports every mismatch, with the same criterion as
``assert_close``: ``|actual - expected| <= atol + rtol * |expected|``, NaN never equal.

Where a tensor has an fp64 twin value (the serial model run again in fp64) and the
tolerance carries a :class:`~cpmatrix.parity.tolerance.TwinRule`, the twin rule judges it
instead: the CP error against the twin within ``factor`` times the serial side's own, plus
a floor (:func:`twin_verdict`); a tensor of a few elements takes at least the rounding
noise pooled over its check's larger tensors (:func:`pooled_noise`). A CP result that
differs from serial by a uniform factor (0.5, 2, 1/world) is named so
(:func:`uniform_ratio`, :func:`ratio_hint`).

Example::

    >>> import torch
    >>> from cpmatrix.parity.tolerance import tolerance_for
    >>> diffs = compare_named({"y": (torch.ones(3), torch.ones(3))}, tolerance_for("fp32"))
    >>> diffs[0].ok, diffs[0].max_abs
    (True, 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cpmatrix.parity.errors import odd_input_fails
from cpmatrix.parity.flips import (
    PROBE_CAP_ULPS,
    PROBE_NOISE,
    Flips,
    Probed,
    Probes,
    allowed_flips,
    flip_verdict,
    probe_draw,
    probes_of,
    second_noise,
    second_of,
    unstable_mask,
)
from cpmatrix.parity.tolerance import Tolerance, TwinRule
from cpmatrix.parity.trees import to_full

__all__ = [
    "POOL_BELOW",
    "Diff",
    "Flips",
    "Probed",
    "allowed_flips",
    "compare_named",
    "format_diffs",
    "judge",
    "pooled_noise",
    "ratio_hint",
    "twin_verdict",
    "uniform_ratio",
    "unstable_mask",
]


#: A tensor of fewer elements is a few samples of its serial side's rounding: one draw can
#: land far below the typical error (measured: 1.8e-5 where the noise is ~1e-3), so its
#: noise estimate is at least its check's pooled one (:func:`pooled_noise`).
POOL_BELOW = 16

@dataclass(frozen=True, slots=True)
class Diff:
    """One tensor's comparison. ``max_abs``/``max_rel``: CP against serial (``max_rel``
    over elements whose serial value is non-zero).

    ``rule`` says what judged it: ``table`` (the fixed ``atol + rtol * |serial|``), or
    ``twin`` (:func:`twin_verdict`: ``twin_err`` = max |CP - twin|, ``serial_err`` = max
    |serial - twin|, ``budget`` = what ``twin_err`` had to stay within), ``twin-pooled``
    (the same, a tensor of a few elements whose budget came from the noise pooled over
    its check's larger tensors), or ``twin-norm`` (the same over the 2-norms, where the
    serial side is rounding noise). ``ratio``: CP /
    serial where it is the same for every element (:func:`uniform_ratio`), else None.
    """

    name: str
    ok: bool
    max_abs: float
    max_rel: float
    bad: int
    numel: int
    note: str = ""
    rule: str = "table"
    twin_err: float = 0.0
    serial_err: float = 0.0
    budget: float = 0.0
    ratio: float | None = None
    #: The elements a rounding-sized probe flips, judged apart (None: no probe ran).
    flips: Flips | None = None
    #: max |second - twin| of the serial side's second sample where it counted, else None.
    second_err: float | None = None
    scale: float = 0.0
    #: The probes' first-order move where it raised the budget above the serial side's
    #: own draw (:data:`PROBE_NOISE`, capped), else None.
    probe_err: float | None = None

    def line(self) -> str:
        text = (
            f"{self.name}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, "
            f"{self.bad}/{self.numel} outside"
        )
        if self.rule != "table":
            what = "||cp - twin||" if self.rule == "twin-norm" else "|cp - twin|"
            pooled = ", noise pooled over the check" if self.rule == "twin-pooled" else ""
            if self.second_err is not None:
                pooled += f", a second serial sample's {self.second_err:.3g}"
            if self.probe_err is not None:
                pooled += f", the probes' move {self.probe_err:.3g}"
            text += (f"; {what} {self.twin_err:.3g} vs budget {self.budget:.3g} "
                     f"(serial's own {self.serial_err:.3g}{pooled})")
        if self.flips is not None and self.flips.unstable:
            text += f"; {self.flips.line()}"
        return f"{text} ({self.note})" if self.note else text


def _diff(
    name: str, actual: Any, expected: Any, tol: Tolerance, twin: Any = None,
    pooled: float = 0.0,
) -> Diff:
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return _leaf_diff(name, actual, expected)
    if actual.shape != expected.shape:
        note = f"shape {tuple(actual.shape)} != serial {tuple(expected.shape)}"
        return Diff(name, False, math.inf, math.inf, expected.numel(), expected.numel(), note)
    numel = expected.numel()
    note = (
        "" if actual.dtype == expected.dtype else f"dtype {actual.dtype} != serial {expected.dtype}"
    )
    if numel == 0:  # nothing to differ, but the shape (above) and dtype must still agree
        return Diff(name, not note, 0.0, 0.0, 0, 0, note)
    a, e = actual.detach().cpu(), expected.detach().cpu()
    rule, twin_err, serial_err, budget, scale = "table", 0.0, 0.0, 0.0, 0.0
    flips: Flips | None = None
    second: float | None = None
    probe: float | None = None
    if _exact(a) and _exact(e):
        # integers and bools: exact, in their own dtype (int64 beyond 2**53 has no float64
        # twin), as assert_close does for them; the evidence (max abs/rel) in float64
        bad_mask = a != e
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
        twin_t = _twin_of(twin, e)
        if tol.twin is not None and twin_t is not None:
            sample, probes = second_of(twin, e), probes_of(twin, e)
            judged = judge(a, e, twin_t, tol.twin, pooled=pooled, probes=probes,
                           second=sample)
            rule, bad_mask, twin_err, serial_err, budget, flips = judged
            usable, _, _, scale = _noise(e, twin_t)
            # what the budget counted, over the elements it counted them on
            stable = _stability(twin_t, probes, usable, tol.twin.floor(scale))[1]
            if sample is not None and (numel < POOL_BELOW or rule == "twin-norm"):
                second = second_noise(sample, twin_t, stable)[0]
            drawn = _probe_draw(tol.twin, probes, twin_t, stable, scale)
            probe = drawn if rule != "twin-norm" and drawn > serial_err else None
        else:
            bad_mask = ~(equal | (finite & (abs_diff <= tol.atol + tol.rtol * e.abs())))
    nonzero = e != 0
    rel = abs_diff[nonzero] / e.abs()[nonzero]
    bad = int(bad_mask.sum())
    ratio = uniform_ratio(a, e) if bad and not _exact(a) else None
    return Diff(name, bad == 0 and not note, _worst(abs_diff), _worst(rel) if rel.numel() else 0.0,
                bad, numel, note, rule, twin_err, serial_err, budget, ratio, flips, second, scale,
                probe)


def _twin_of(twin: Any, expected: torch.Tensor) -> torch.Tensor | None:
    """The twin value as a CPU tensor when it can judge ``expected`` (float64 or
    complex128 already): of the same shape, float64 for a real value and complex128 for a
    complex one (a twin that did not really run in fp64, or computed something else,
    cannot). A :class:`Probed` twin value gives its ``value``."""
    if isinstance(twin, Probed):
        twin = twin.value
    if not isinstance(twin, torch.Tensor) or twin.shape != expected.shape:
        return None
    if twin.dtype != (torch.complex128 if expected.is_complex() else torch.float64):
        return None
    return twin.detach().cpu()


def _noise(serial: torch.Tensor, twin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                               float, float]:
    """``(usable, |serial - twin| where usable, max of it, max |twin|)``: the serial side's
    rounding against the twin, and the value's scale."""
    usable = torch.isfinite(serial) & torch.isfinite(twin)
    serial_abs = torch.where(usable, (serial - twin).abs(), 0.0)
    scale = _worst(torch.where(usable, twin.abs(), 0.0)) if twin.numel() else 0.0
    serial_err = _worst(serial_abs) if serial_abs.numel() else 0.0
    return usable, serial_abs, serial_err, scale


def pooled_noise(serial_and_twin: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The serial side's typical relative rounding over the tensors of one check that
    estimate it: the median over those tensors of ``max |serial - twin| / max |twin|``
    (the upper median: with two tensors, the larger), among the tensors of at least
    :data:`POOL_BELOW` elements judged elementwise (not rounding noise themselves:
    ``twin-norm``); 0.0 where none does.

    The median, not the worst: one tensor of a cancelling sum rounds at 10x the others'
    relative error, and a bias pooled with that would hide a bug of 10% (docs/parity.md,
    "Tensors of one or a few elements").

    >>> t = torch.linspace(1.0, 2.0, 32, dtype=torch.float64)
    >>> round(pooled_noise([(t + 1e-3, t), (t[:1] + 0.5, t[:1])]), 6)  # one element: skipped
    0.0005
    >>> round(pooled_noise([(t + 1e-3, t), (t + 1e-4, t), (t + 0.2, t)]), 6)  # the median
    0.0005
    """
    ratios = []
    for serial, twin in serial_and_twin:
        if serial.numel() < POOL_BELOW:
            continue
        _, _, serial_err, scale = _noise(serial, twin)
        if scale > 0.0 and serial_err < 0.5 * scale:
            ratios.append(serial_err / scale)
    return sorted(ratios)[len(ratios) // 2] if ratios else 0.0


def twin_verdict(
    cp: torch.Tensor, serial: torch.Tensor, twin: torch.Tensor, rule: TwinRule,
    *, pooled: float = 0.0,
    probes: Probes | None = None,
) -> tuple[str, torch.Tensor, float, float, float]:
    """Judge ``cp`` by the fp64 twin rule: ``(rule name, bad mask, twin_err, serial_err,
    budget)``. All three are float64 (or complex128) tensors of one shape.

    Elementwise: ``|cp_i - twin_i| <= factor * max_j |serial_j - twin_j| + floor`` with
    ``floor = floor_ulps * eps * max_j |twin_j|``. A CP value equal to the serial one
    always passes (an infinity included); NaN never does. Where the serial side is
    rounding noise (its worst error at least half the value's scale: a grad that cancels
    to nothing), no element carries a value to compare, and the 2-norms of the errors
    are compared instead (``twin-norm``): ``||cp - twin|| <= factor * ||serial - twin|| +
    floor * sqrt(n)``. A tensor of fewer than :data:`POOL_BELOW` elements uses at least
    ``pooled * max_j |twin_j|`` as the serial side's error (``pooled``: its check's
    relative noise, :func:`pooled_noise`); rule ``twin-pooled`` where that decided.

    ``probes`` (the twin's antithetic probes, :class:`Probed`): the elements they flip
    (:func:`unstable_mask`) are left out of the stable elements' noise and budget and
    judged apart (:class:`Flips`, in :func:`judge`): a serial side that flipped one never
    loosens the rest of its tensor, and a CP side that flipped one fails only when it
    flipped more than the serial side or the probes did, or moved one farther.

    >>> from cpmatrix.parity.tolerance import tolerance_for
    >>> t = torch.tensor([1.0, 2.0], dtype=torch.float64)
    >>> s, c = t + 1e-3, t + torch.tensor([1e-3, 0.1], dtype=torch.float64)
    >>> name, bad, twin_err, serial_err, budget = twin_verdict(c, s, t, tolerance_for("bf16").twin)
    >>> name, bad.tolist(), round(budget, 4)
    ('twin', [False, True], 0.0665)
    """
    name, bad, twin_err, serial_err, budget, _ = judge(cp, serial, twin, rule, pooled=pooled,
                                                       probes=probes)
    return name, bad, twin_err, serial_err, budget


def _stability(twin: torch.Tensor, probes: Probes | None, usable: torch.Tensor,
               floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unstable, stable)``: the usable elements a probe flips, and the rest."""
    unstable = (unstable_mask(twin, probes, floor) & usable if probes is not None
                else torch.zeros_like(usable))
    return unstable, usable & ~unstable


def _probe_draw(rule: TwinRule, probes: Probes | None, twin: torch.Tensor,
                stable: torch.Tensor, scale: float) -> float:
    """The probes' move as a draw of the serial noise where the precision counts it
    (:data:`PROBE_NOISE`), capped at :data:`PROBE_CAP_ULPS` of the value's scale."""
    if rule.precision not in PROBE_NOISE:
        return 0.0
    return probe_draw(probes, twin, stable, PROBE_CAP_ULPS * rule.eps * scale)


_Judged = tuple[str, torch.Tensor, float, float, float, "Flips | None"]


def judge(
    cp: torch.Tensor, serial: torch.Tensor, twin: torch.Tensor, rule: TwinRule,
    *, pooled: float = 0.0,
    probes: Probes | None = None,
    second: torch.Tensor | None = None,
) -> _Judged:
    """:func:`twin_verdict`, with the flips' verdict (:class:`Flips`; None without probes)
    as a sixth value. The ``second`` serial sample's noise (:func:`second_noise`) counts
    in a tensor of fewer than :data:`POOL_BELOW` elements or a cancelling one
    (``twin-norm``): docs/parity.md, "Tiny tensors"; the probes' first-order move
    (:func:`probe_draw`, capped) in every tensor of a :data:`PROBE_NOISE` precision judged
    element by element."""
    equal = cp == serial
    usable, _, _, scale = _noise(serial, twin)
    floor = rule.floor(scale)
    unstable, stable = _stability(twin, probes, usable, floor)
    serial_abs = torch.where(stable, (serial - twin).abs(), 0.0)
    serial_err = _worst(serial_abs) if serial_abs.numel() else 0.0
    cp_abs = torch.where(torch.isfinite(cp) & usable, (cp - twin).abs(), math.inf)
    cp_abs = torch.where(equal, 0.0, cp_abs)
    second_max, second_norm = second_noise(second, twin, stable)
    probe_max = _probe_draw(rule, probes, twin, stable, scale)
    if serial_err >= 0.5 * scale and bool(stable.any()):
        n = int(stable.sum())
        serial_norm = max(float(torch.linalg.vector_norm(serial_abs)), second_norm)
        cp_norm = float(torch.linalg.vector_norm(torch.where(stable, cp_abs, 0.0)))
        budget = rule.factor * serial_norm + floor * math.sqrt(n)
        # the stable elements by their norms; the unstable ones as flips
        flips, flip_bad = flip_verdict(cp_abs, serial, twin, probes, unstable,
                                 torch.zeros_like(stable), equal,
                                 rule.budget(serial_err=serial_err, scale=scale), rule.factor)
        bad = (torch.full(cp.shape, cp_norm > budget) & stable) | flip_bad
        return "twin-norm", bad & ~equal, cp_norm, serial_norm, budget, flips
    tiny = cp.numel() < POOL_BELOW
    estimate = pooled * scale if tiny else 0.0
    own = max(serial_err, second_max if tiny else 0.0, probe_max)
    if probes is not None:
        # a step check (the twin probed): the tensor's own noise times the factor, plus
        # one typical draw of its check's noise (docs/parity.md, "Tensors of one or a few
        # elements")
        name = "twin-pooled" if estimate > 0.0 else "twin"
        budget = rule.budget(serial_err=own, scale=scale) + estimate
    else:
        name = "twin-pooled" if estimate > own else "twin"
        budget = rule.budget(serial_err=max(own, estimate), scale=scale)
    flips, bad = flip_verdict(cp_abs, serial, twin, probes, unstable, stable | ~usable, equal,
                        budget, rule.factor)
    stable_cp = torch.where(unstable, 0.0, cp_abs)
    twin_err = _worst(stable_cp) if stable_cp.numel() else 0.0
    return name, bad, twin_err, serial_err, budget, flips


def uniform_ratio(cp: torch.Tensor, serial: torch.Tensor) -> float | None:
    """CP / serial where it is the same for every element that carries the value (those
    at least a tenth of the largest), within 1%; None otherwise, or with fewer than two.

    >>> x = torch.tensor([1.0, -2.0, 3.0, 1e-9], dtype=torch.float64)
    >>> uniform_ratio(0.5 * x, x)
    0.5
    >>> uniform_ratio(x + 1, x) is None
    True
    """
    if cp.is_complex() or serial.is_complex():
        return None
    big = serial.abs() >= 0.1 * _worst(serial.abs()) if serial.numel() else serial.bool()
    big = big & torch.isfinite(cp) & torch.isfinite(serial) & (serial != 0)
    if int(big.sum()) < 2:
        return None
    ratios = cp[big] / serial[big]
    mid = float(ratios.median())
    if mid == 0.0 or not bool(((ratios - mid).abs() <= 0.01 * abs(mid)).all()):
        return None
    return round(mid, 6)


def ratio_hint(ratio: float | None, sizes: Mapping[str, int]) -> str:
    """What a uniform CP / serial ratio suggests, given the mesh's axis sizes.

    >>> ratio_hint(0.5, {"cp0": 2, "cp1": 1})
    'CP = 0.5 x serial everywhere: mean vs sum over `cp0`?'
    >>> ratio_hint(4.0, {"cp0": 2, "cp1": 2})[28:]
    'a sum where serial takes the mean (or counted twice) over `cp0 x cp1`?'
    >>> ratio_hint(-1.0, {"cp0": 2})
    'CP = -1 x serial everywhere: a sign flipped?'
    >>> ratio_hint(1.3, {"cp0": 2})
    'CP = 1.3 x serial everywhere: a missing or extra scale factor?'
    """
    if not ratio or ratio == 1.0:  # uniform_ratio never gives 0: nothing to say of it
        return ""
    head = f"CP = {ratio:.3g} x serial everywhere: "
    if math.isclose(ratio, -1.0, rel_tol=1e-3):
        return head + "a sign flipped?"
    axes = {name: size for name, size in sizes.items() if size > 1}
    # each axis, and the whole mesh (with one axis that is the axis itself again)
    groups = {**axes, " x ".join(axes): math.prod(axes.values())} if axes else {}
    for k, way in ((1.0 / ratio, "mean vs sum"),
                   (ratio, "a sum where serial takes the mean (or counted twice)")):
        names = [n for n, size in groups.items() if math.isclose(k, size, rel_tol=1e-3)]
        if names:
            return head + f"{way} over " + " or ".join(f"`{n}`" for n in names) + "?"
    return head + "a missing or extra scale factor?"


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
        return Diff(name, False, math.inf, math.inf, 0, 0, f"missing on the {missing} side")
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        note = f"{type(actual).__name__} != serial {type(expected).__name__}"
        return Diff(name, False, math.inf, math.inf, 1, 1, note)
    try:
        same = bool(actual == expected)
    except (TypeError, ValueError, RuntimeError):  # e.g. arrays: no single truth value
        same = False
    note = "" if same else f"{actual!r} != {expected!r}"
    return Diff(name, same, 0.0 if same else math.inf, 0.0, int(not same), 1, note)


def compare_named(pairs: Mapping[str, tuple[Any, ...]], tol: Tolerance) -> list[Diff]:
    """One :class:`Diff` per name, ``pairs[name] = (actual_cp, expected_serial)`` or
    ``(actual_cp, expected_serial, fp64_twin)``.

    DTensors are reassembled with :func:`to_full` first. A twin value (None: none) makes
    the tolerance's twin rule judge the tensor, where it has one (:func:`twin_verdict`).
    Nothing raises for values that differ: the caller decides which check the mismatches
    belong to; ``pairs`` that are not a mapping of such tuples fail ``setup``.
    """
    with odd_input_fails("setup"):
        named = [(name, *_unpack(value)) for name, value in pairs.items()]
    full = [(name, to_full(a), to_full(e), t) for name, a, e, t in named]  # collectives
    with odd_input_fails("setup"):
        pooled = pooled_noise(_serial_and_twin(full, tol.twin)) if tol.twin is not None else 0.0
        return [_diff(name, a, e, tol, t, pooled) for name, a, e, t in full]


def _serial_and_twin(full: list[tuple[str, Any, Any, Any]],
                     rule: TwinRule) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(serial, twin) in float64 (or complex128) for each tensor a twin can judge; the
    serial side's unstable elements (:func:`unstable_mask`) set to the twin's value: a
    flip is no sample of the rounding."""
    for _, _, e, t in full:
        if not isinstance(e, torch.Tensor) or _exact(e):
            continue
        wide = e.detach().cpu().to(torch.promote_types(e.dtype, torch.float64))
        twin_t = _twin_of(t, wide)
        if twin_t is None:
            continue
        probes = probes_of(t, wide)
        if probes is not None:
            _, _, _, scale = _noise(wide, twin_t)
            wide = torch.where(unstable_mask(twin_t, probes, rule.floor(scale)), twin_t, wide)
        yield wide, twin_t


def _unpack(value: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    cp, serial, *rest = value
    if len(rest) > 1:
        raise ValueError(f"a pair (cp, serial) or a triple (cp, serial, twin), got {len(value)}")
    return cp, serial, (rest[0] if rest else None)


def format_diffs(
    check: str, diffs: list[Diff], tol: Tolerance, sizes: Mapping[str, int] | None = None
) -> str:
    """A block listing every mismatching tensor of one check (for the error message).

    A tensor with a uniform CP / serial ratio gets a hint (``sizes``: the mesh's axis
    sizes, to name the axis a mean/sum mix-up runs over). A shape mismatch is one line.
    """
    bad = [d for d in diffs if not d.ok]
    rules = {d.rule for d in diffs}
    judged = tol.describe() if rules != {"table"} or tol.twin is None else (
        f"rtol={tol.rtol:.3g}, atol={tol.atol:.3g} ({tol.source}; no fp64 twin value)")
    head = f"{check}: {len(bad)} of {len(diffs)} tensors differ from serial ({judged})"
    lines = [head]
    for d in bad:
        if d.note.startswith("shape "):
            lines.append(f"  {d.name}: {d.note}")
            continue
        lines.append(f"  {d.line()}")
        hint = ratio_hint(d.ratio, sizes or {})
        if hint:
            lines.append(f"    {hint}")
    return "\n".join(lines)
