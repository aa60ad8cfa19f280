"""Branch-aware judging: the elements whose value depends on a discrete decision (a ReLU
mask, a top-k routing, a comparison) that rounding can flip.

The fp64 twin rule assumes the error grows smoothly with rounding. Where a decision flips,
an element moves by O(value): on the CP side that false-fails correct code, on the serial
side it inflates the budget of the whole tensor until a real bug hides in it. So the twin
runs again with antithetic probes (:func:`cpmatrix.parity._twin.run_probes`): the elements
that jump under one of them are *unstable* (:func:`unstable_mask`). They are kept out of
the stable elements' noise and budget, and the elements the CP side moves off that budget
are judged as a population of their own (:func:`flip_verdict`): about as many as the
serial side or one probe moved (:func:`allowed_flips`), each within the reach of a flip.
Derivation and measurements: docs/parity.md, "Discrete decisions".

Where one serial sample cannot judge (a tensor of a few elements, a cancelling sum), a
twin value carries the serial side's second sample in the cell's precision
(:attr:`Probed.second`, :func:`second_noise`), and the evidence names what a tiny tensor's
budget lets pass (:func:`resolution_line`): docs/parity.md, "The second serial sample".

Example::

    >>> t = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    >>> jump = torch.tensor([0.0, 0.0, 0.8], dtype=torch.float64)
    >>> unstable_mask(t, (t + jump, t), 1e-6).tolist()
    [False, False, True]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "BUG_SIZE",
    "NAMED_FLIPS",
    "PROBE_CAP_ULPS",
    "PROBE_NOISE",
    "PROBE_ULPS",
    "Flips",
    "Probed",
    "Probes",
    "allowed_flips",
    "flip_verdict",
    "probe_draw",
    "probes_of",
    "resolution_line",
    "second_noise",
    "second_of",
    "unstable_mask",
]

#: The probes' step, in ulps (eps) of the precision the cell computes in: relative to each
#: input value, and to the rms of each module's output (the rounding a sum's result takes
#: at the scale of its terms, which a value near 0 does not show). One op's rounding is
#: half an ulp; two ulps cover a few adding up, so a decision the serial or CP side's
#: rounding flips is flipped by a probe too (measured: docs/parity.md, "Discrete
#: decisions").
PROBE_ULPS = 2.0

#: The precisions in which the probes' first-order move counts as one more draw of the
#: serial side's noise (:func:`probe_draw`): where the cell computes in one precision
#: throughout, a step at every module's output is the rounding of a few ops at the terms'
#: scale, which one serial draw of a cancelling sum can miss (measured: fp32, a 16-element
#: grad whose serial draw was 2.7 ulps where the CP side's was 20 and the probes moved it
#: 19.7). In bf16/fp16 (and under autocast, whose reductions run in fp32) the same move is
#: 2 to 6 times the rounding, and counting it would put a 10% bug on a tiny tensor within
#: budget: there the second sample decides (docs/parity.md, "The probes' move").
PROBE_NOISE = frozenset({"fp32"})

#: The most the probes' move may count for, in ulps of the tensor's largest value: a move
#: is a draw of rounding only while it is rounding-sized. A decision sitting exactly on its
#: threshold (``sign(0)``, a tie) jumps both ways under the two steps and looks smooth, and
#: a module output whose rms is far above one element's scale is stepped far beyond that
#: element's rounding: uncapped, either let a bug of any size pass (measured in the review:
#: 82% to over 200% of the value). 32 ulps covers the 19.7 measured, and bounds what this
#: rule can let through at about 4 x 32 ulps (1.5e-5 of the value in fp32).
PROBE_CAP_ULPS = 32.0

#: At most this many flipped elements are named in the evidence (the count is always given).
NAMED_FLIPS = 5

#: The bug size the evidence measures a tiny tensor's resolution against: a tensor whose
#: budget is above this fraction of its largest value is named BELOW RESOLUTION (a bug of
#: this size on it is within its rounding noise and cannot fail: docs/parity.md, "Tiny
#: tensors").
BUG_SIZE = 0.1


@dataclass(frozen=True, slots=True)
class Probed:
    """A twin value with its antithetic probes: the twin run again with its inputs and
    every module's outputs moved by ``+d`` and ``-d`` (``d`` a rounding-sized step with
    random signs, :func:`cpmatrix.parity._twin.run_probes`), ``probes`` in pairs
    ``(plus, minus, plus, minus, ...)``, one pair per sign pattern. Where the value is a
    smooth function of those, ``plus + minus - 2 * value`` is second order in ``d``
    (tiny); where a discrete decision flips under one of them (a ReLU mask, a top-k
    routing) it is the size of the jump (:func:`unstable_mask`).

    ``second``: the serial side's second sample in the cell's precision, upcast (its rows
    split, :mod:`cpmatrix.parity._second`): a second draw of the rounding noise for the
    tensors one draw cannot judge (:func:`second_noise`); None where none was taken."""

    value: torch.Tensor
    probes: tuple[torch.Tensor, ...]
    second: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class Flips:
    """The unstable elements of one tensor, judged as a population of their own.

    ``unstable``: how many elements flip under a rounding-sized probe; ``cp`` and
    ``serial``: how many of them each side moved beyond the stable elements' budget;
    ``allowed``: how many the CP side may move so (``allowed_flips``); ``where``: the
    first :data:`NAMED_FLIPS` indices the CP side moved; ``ok``: within ``allowed``, each
    within its element's reach (``factor`` times the farthest that serial or a probe moved
    it, plus the budget).
    """

    unstable: int
    cp: int
    serial: int
    allowed: int
    where: tuple[tuple[int, ...], ...] = ()
    ok: bool = True

    def line(self) -> str:
        named = ", ".join(str(w[0]) if len(w) == 1 else str(w) for w in self.where)
        more = ", ..." if self.cp > len(self.where) else ""
        text = (
            f"{self.unstable} unstable (a rounding-sized probe flips them): CP moved "
            f"{self.cp} [{named}{more}], serial {self.serial}, allowed {self.allowed}"
        )
        return text if self.ok else text + ", FLIPS BEYOND THE SERIAL SIDE'S"


def allowed_flips(base: int) -> int:
    """How many unstable elements the CP side may move off the budget where the serial
    side or a probe moved ``base``: about as many, plus a small slack (one, and half as
    many again: which near-ties a different rounding order flips is itself random).

    >>> [allowed_flips(n) for n in (0, 1, 2, 10)]
    [1, 2, 4, 16]
    """
    return base + 1 + base // 2


Probes = tuple[torch.Tensor, ...]


def probes_of(twin: Any, expected: torch.Tensor) -> Probes | None:
    """A :class:`Probed` twin value's probes, when every one can judge ``expected`` as the
    twin value itself can and they come in pairs; None otherwise."""
    if not isinstance(twin, Probed) or not twin.probes or len(twin.probes) % 2:
        return None
    probes = tuple(_as_twin(p, expected) for p in twin.probes)
    if any(p is None for p in probes):
        return None
    return probes  # type: ignore[return-value]


def second_of(twin: Any, expected: torch.Tensor) -> torch.Tensor | None:
    """A :class:`Probed` twin value's second serial sample, when it can judge
    ``expected`` as the twin value itself can; None otherwise."""
    second = twin.second if isinstance(twin, Probed) else None
    return None if second is None else _as_twin(second, expected)


def second_noise(second: torch.Tensor | None, twin: torch.Tensor,
                 stable: torch.Tensor) -> tuple[float, float]:
    """The second serial sample's rounding over the ``stable`` elements: ``(max, 2-norm)``
    of ``|second - twin|`` (a flip is no sample of the rounding); ``(0.0, 0.0)`` without
    one. An element not finite in the sample counts as none (it bounds nothing).

    >>> t = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    >>> second_noise(t + torch.tensor([0.5, -0.75, 8.0], dtype=torch.float64), t,
    ...              torch.tensor([True, True, False]))
    (0.75, 0.9013878188659973)
    """
    if second is None:
        return 0.0, 0.0
    err = torch.where(stable & second.isfinite(), (second - twin).abs(), 0.0)
    if not err.numel():
        return 0.0, 0.0
    return float(err.max()), float(torch.linalg.vector_norm(err))


def probe_draw(probes: Probes | None, twin: torch.Tensor, stable: torch.Tensor,
               cap: float) -> float:
    """The probes' first-order move as one draw of the serial side's rounding: the last
    pair's ``|plus - minus| / 2`` (the part that changes sign with the step: a smooth
    value's response, with a one-sided jump left out), its largest over the ``stable``
    elements, at most ``cap``; 0.0 without probes. The last pair moves a module's outputs
    alone (:func:`cpmatrix.parity._twin.run_probes`): the inputs are the same on both sides,
    their step is no rounding either side took. A move that is not finite counts as none.

    >>> t = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    >>> d = torch.tensor([0.25, -0.5, 8.0], dtype=torch.float64)
    >>> probe_draw((t, t, t + d, t - d), t, torch.tensor([True, True, False]), cap=1.0)
    0.5
    >>> probe_draw((t, t, t + d, t - d), t, torch.tensor([True, True, False]), cap=0.125)
    0.125
    """
    if not probes or len(probes) < 2 or not stable.numel():
        return 0.0
    plus, minus = probes[-2], probes[-1]
    move = (plus - minus).abs() / 2
    move = torch.where(stable & move.isfinite(), move, 0.0)
    return min(float(move.max()), cap)


def resolution_line(name: str, budget: float, scale: float) -> str:
    """What a tiny tensor's budget lets through, as a fraction of its largest value, and
    whether a :data:`BUG_SIZE` bug on it can fail at all.

    >>> resolution_line("b", 0.05, 1.0)
    'b: a change under 5% of its largest value (1) passes'
    >>> resolution_line("b", 0.25, 0.5)[49:]
    'passes: BELOW RESOLUTION (a 10% bug on it is within its rounding noise)'
    """
    frac = budget / scale if scale > 0.0 else 0.0
    text = f"{name}: a change under {100 * frac:.2g}% of its largest value ({scale:.3g}) passes"
    if frac > BUG_SIZE:
        text += f": BELOW RESOLUTION (a {BUG_SIZE:.0%} bug on it is within its rounding noise)"
    return text


def unstable_mask(twin: torch.Tensor, probes: Probes, threshold: float) -> torch.Tensor:
    """The elements whose value jumps under an antithetic pair of probes (``probes``:
    ``plus, minus, plus, minus, ...``): ``|plus + minus - 2 * twin| > threshold`` for any
    pair (a smooth value moves by opposite amounts, to first order, under opposite steps;
    a flipped decision moves it one way only, by the jump; two pairs of independent signs,
    because two jumps of one pair can cancel in one element), or not finite under a
    probe while finite in the twin.

    >>> t = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    >>> unstable_mask(t, (t + 1e-3, t - 1e-3), 1e-6).tolist()  # smooth: moves both ways
    [False, False, False]
    >>> jump = torch.tensor([0.0, 0.0, 0.8], dtype=torch.float64)
    >>> unstable_mask(t, (t + 1e-3, t - 1e-3, t + jump, t), 1e-6).tolist()  # 2nd pair: flips
    [False, False, True]
    """
    out = torch.zeros(twin.shape, dtype=torch.bool)
    for plus, minus in zip(probes[0::2], probes[1::2], strict=True):
        jump = (plus + minus - 2 * twin).abs()
        finite = torch.isfinite(plus) & torch.isfinite(minus)
        out |= torch.where(finite, jump > threshold, torch.isfinite(twin))
    return out


def _reach(
    serial: torch.Tensor,
    twin: torch.Tensor,
    probes: Probes,
    unstable: torch.Tensor,
    budget: float,
    factor: float,
) -> float:
    """How far the CP side may move an element it flips: ``factor`` times the farthest the
    serial side or a probe moved an unstable element, plus the stable budget (over the
    tensor, not per element: two flips the probes made can cancel in one element that a
    single flip of the CP side moves). A move that is not finite (a probe that overflowed:
    unstable by :func:`unstable_mask`) counts as none: it bounds nothing. Called where
    ``unstable`` has an element, so there is a largest move."""
    moved = torch.stack([(side - twin).abs() for side in (serial, *probes)])
    return factor * float(torch.where(unstable & moved.isfinite(), moved, 0.0).max()) + budget


def flip_verdict(
    cp_abs: torch.Tensor,
    serial: torch.Tensor,
    twin: torch.Tensor,
    probes: Probes | None,
    unstable: torch.Tensor,
    stable: torch.Tensor,
    equal: torch.Tensor,
    budget: float,
    factor: float,
) -> tuple[Flips | None, torch.Tensor]:
    """The flipped elements' verdict and the ones that fail. In a tensor where the probes
    found unstable elements, every element the CP side moved off the stable ``budget``
    counts as a flip: at most about as many as the serial side or one probe moved off it
    (:func:`allowed_flips`; beyond that every one fails), each within the reach of a flip
    (:func:`_reach`). Elsewhere (no probes, nothing unstable) there is no flip: the stable
    elements off ``budget`` fail as they are."""
    off_cp = ~equal & (cp_abs > budget) & (stable | unstable)
    if probes is None or not bool(unstable.any()):
        return None, off_cp
    moved = [int((unstable & ((side - twin).abs() > budget)).sum()) for side in (serial, *probes)]
    allowed = allowed_flips(max(moved))
    n_cp = int(off_cp.sum())
    bad = (
        off_cp
        if n_cp > allowed
        else off_cp & (cp_abs > _reach(serial, twin, probes, unstable, budget, factor))
    )
    where = tuple(tuple(int(i) for i in idx) for idx in off_cp.nonzero()[:NAMED_FLIPS].tolist())
    return Flips(int(unstable.sum()), n_cp, moved[0], allowed, where, not bool(bad.any())), bad


def _as_twin(value: Any, expected: torch.Tensor) -> torch.Tensor | None:
    """A probe as a CPU tensor that can judge ``expected`` (float64 for a real value,
    complex128 for a complex one, of its shape), else None."""
    if not isinstance(value, torch.Tensor) or value.shape != expected.shape:
        return None
    if value.dtype != (torch.complex128 if expected.is_complex() else torch.float64):
        return None
    return value.detach().cpu()
