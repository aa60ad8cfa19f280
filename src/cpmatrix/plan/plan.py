"""The plan stage's one object: :class:`Plan`, made once by :func:`make_plan`.

A run is planned once, before anything starts: the cells that fit this host (the rest
skipped, with why), the worlds they are split into, how a world packs them and the
recorded durations it packs by (a :class:`Placement`), then each planner's batches, each
batch with its packing. The real run executes the plan as given
(:func:`cpmatrix.supervise.session.run_cells`); ``--dry-run`` prints the same plan.

The plan stage sits below the supervisor: what it needs of an executor is a
:class:`Planner` (the executor protocol,
:class:`cpmatrix.supervise.executors.base.Executor`, is one), and the plan hands the
planners it was given back with their batches, typed as given.

Example::

    placement = Placement(cells=tuple(cells), worlds=2, pack=PackSpec(),
                          durations={"t1": 3.0})
    plan = make_plan(EXECUTORS, placement, cached={"t1"})
    for executor, batches in plan.batches:
        ...
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.batches import Batch
from cpmatrix.plan.packing import PackSpec
from cpmatrix.plan.settings import PLAN_DEFAULTS, PlanSettings

__all__ = ["Placement", "Plan", "Planner", "make_plan", "planner_for"]


class Planner(Protocol):
    """What the plan stage needs of an executor: the kinds it runs and its batches."""

    name: str
    #: The cell kinds it runs (``matrix.schema.KINDS``): each kind is one planner's.
    kinds: tuple[str, ...]
    #: Its cells can run with a declared mutant switched on.
    supports_mutants: bool

    def plan(self, cells: Sequence[Cell], settings: PlanSettings, *,
             durations: Mapping[str, float], worlds: int = 1, pack: PackSpec | None = None,
             mutants: Mapping[str, Sequence[str]] | None = None) -> list[Batch]:
        """Cut ``cells`` (each once per mutant, with ``mutants``) into launchable batches
        (``settings``: ``--batch-size``, ``--keep-order``; ``durations``: expected seconds
        per cell id); ``worlds``: how many of them may run at once (``--jobs``), to balance over;
        ``pack``: how a world places its cells on its ranks (ignored where no world)."""


P = TypeVar("P", bound=Planner)


def planner_for(planners: Sequence[P], kind: str) -> P:
    """The planner among ``planners`` that runs cells of ``kind``; KeyError for a kind
    none of them runs."""
    for planner in planners:
        if kind in planner.kinds:
            return planner
    raise KeyError(kind)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """What a plan is made from, found once per run: the cells that fit this host and
    those skipped with why, the devices, the worlds, the pack and the durations."""

    #: The cells this host can run, in the run's order.
    cells: tuple[Cell, ...]
    #: Selected cells this host cannot run (a cuda cell wider than its GPUs), with why.
    skipped: tuple[tuple[Cell, str], ...] = ()
    #: cuda devices in the run's pool (``--gpus``, else the visible ones where needed).
    devices: int = 0
    #: Whether any selected cell needs a cuda device.
    needs_devices: bool = False
    #: How many worlds each platform's cells are split into (``--jobs``; under Slurm,
    #: weighed by the recorded durations).
    worlds: int = 1
    #: How a world places its cells on its ranks (``--pack``, ``--world-ranks``).
    pack: PackSpec = field(default_factory=PackSpec)
    #: Expected seconds per cell id the worlds pack by (none with ``--order``: one order,
    #: one placement).
    durations: Mapping[str, float] = field(default_factory=dict)
    #: ``--batch-size``, ``--keep-order``, ``--runs-per-test``.
    settings: PlanSettings = PLAN_DEFAULTS
    #: The batches launch longest-expected first, whatever their planner: where each of
    #: the job slots takes the longest world left when it frees (Slurm's: greedy
    #: longest-first onto the least-loaded slot). Else in the planners' order.
    longest_first: bool = False


@dataclass(frozen=True, kw_only=True)
class Plan(Generic[P]):
    """A run's plan, made once (:func:`make_plan`) and executed as given."""

    #: What it was made from.
    placement: Placement
    #: Each planner's batches (each cell ``settings.runs`` times), in the planners' order.
    batches: tuple[tuple[P, tuple[Batch, ...]], ...]
    #: Cells not run: their cached pass is reported.
    cached: tuple[Cell, ...] = ()
    #: Cells reported ``skipped``, with why (the placement's, unless the front says them
    #: itself before the run: ``repro``).
    skipped: tuple[tuple[Cell, str], ...] = ()

    @property
    def cells(self) -> tuple[Cell, ...]:
        """The cells this host runs (the cached ones among them)."""
        return self.placement.cells

    @property
    def launches(self) -> tuple[tuple[P, Batch], ...]:
        """Every batch with its planner, in the order the run launches them."""
        flat = tuple((p, b) for p, batches in self.batches for b in batches)
        if self.placement.longest_first:
            return tuple(sorted(flat, key=lambda pb: -pb[1].expected_s))
        return flat

    @property
    def runs(self) -> int:
        """How often each cell runs (``--runs-per-test``)."""
        return self.placement.settings.runs


def make_plan(planners: Sequence[P], placement: Placement, *, cached: Collection[str] = (),
              mutants: Mapping[str, Sequence[str]] | None = None,
              report_skipped: bool = True) -> Plan[P]:
    """The run's plan: each planner's batches of its own kinds' cells (each cell
    ``settings.runs`` times; ``mutants`` only where the planner takes them), in the order
    of ``planners``. A cell whose id is in ``cached`` is not run (its cached pass is
    reported), unless the run has mutants: a mutant is judged against its cell run here.
    ``report_skipped``: the run reports the placement's skipped cells (``repro`` says
    them itself)."""
    settings = placement.settings
    hits = tuple(c for c in placement.cells if c.id in cached and not mutants)
    served = {c.id for c in hits}
    todo: dict[int, list[Cell]] = {id(p): [] for p in planners}
    for c in placement.cells:
        if c.id not in served:
            todo[id(planner_for(planners, c.kind))].extend([c] * settings.runs)
    batches = tuple(
        (p, tuple(p.plan(todo[id(p)], settings, durations=placement.durations,
                         worlds=placement.worlds, pack=placement.pack,
                         mutants=mutants if p.supports_mutants else None)))
        for p in planners)
    return Plan(placement=placement, batches=batches, cached=hits,
                skipped=placement.skipped if report_skipped else ())
