"""The executor protocol: what runs a kind of cell, behind one interface; and the one
question the core asks of a run's executors (:func:`executor_for`).

A run's session never branches on a cell's kind: each executor is a planner
(:class:`cpmatrix.plan.plan.Planner`: the plan stage cuts its cells into batches, once,
:func:`cpmatrix.plan.plan.make_plan`), and the session launches each planned batch as a
:class:`Job` it polls until it is finished. Every job keeps the same promises:
each entry ends as exactly one result, or is handed back (``remaining``) to run in a fresh
job after a fault that was not its own; ``start_failed`` says the job never started a
cell (the session retries it).

The core names no concrete executor: the registry (one executor per kind of cell,
:data:`cpmatrix.kinds.executors.EXECUTORS`) is built above it and handed down by the
fronts, through the pipeline's entry points, to every function here that takes
``executors``. A new kind of cell is a new executor in that tuple; the session loop does
not change.

Example::

    executor_for(EXECUTORS, cell.kind).devices_needed([Entry(cell=cell)], platform)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cpmatrix.matrix.schema import Platform
from cpmatrix.plan.batches import Batch
from cpmatrix.plan.packing import Packing, PackSpec
from cpmatrix.plan.plan import Planner, planner_for
from cpmatrix.result import Result
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.entry import Entry

__all__ = ["Executor", "Job", "executor_for"]


class Job(Protocol):
    """One launch of a batch: started once, polled until ``finished``."""

    # Read-only to the session (properties, so a wrapper such as a Slurm job can
    # delegate them); a job sets its own as plain attributes.
    @property
    def name(self) -> str: ...
    @property
    def token(self) -> str:
        """``<run id>/<job>``: in every process it starts (their leftovers are found by
        it) and the name a wrapping scheduler submits it under."""
    @property
    def entries(self) -> list[Entry]: ...
    @property
    def devices(self) -> tuple[int, ...]:
        """cuda devices held by this job (given back to the pool when it finishes)."""
    @property
    def finished(self) -> bool: ...
    @property
    def remaining(self) -> list[Entry]:
        """Entries handed back to run in a fresh job (after a fault, or a recycle)."""
    @property
    def start_failed(self) -> bool:
        """True when the job never started a cell; the session may retry it."""
    @property
    def start_error(self) -> str: ...
    @property
    def lost(self) -> str:
        """Why the infrastructure ended the job from outside (a scheduler's cancel, time
        limit, node failure), or "": its unfinished cells (``remaining``, the ones in
        flight too) have no verdict and run again; none of them is blamed."""

    def start(self) -> None:
        """Launch; an OS error fails the job's cells, never the run."""

    def queued(self) -> None:
        """Told by a wrapper whose scheduler still holds the job in its queue (a Slurm
        job PENDING): queue time is not start-up time, so the job's start-up clock
        starts again from now."""

    def poll(self) -> list[tuple[Entry, Result]]:
        """Advance without blocking; the results completed since the last call."""

    def kill(self) -> None:
        """Stop now (the run was interrupted); nothing it started may outlive this."""

    def launcher_tail(self) -> str:
        """The last lines its launcher printed (why it did not start, say)."""


class Executor(Planner, Protocol):
    """Runs one kind of cell: plans its batches (a :class:`~cpmatrix.plan.plan.Planner`:
    ``name``, ``kinds``, ``supports_mutants``, ``plan``) and makes their jobs."""

    #: What its jobs are, in messages: "a world", "the spill compiler"; and counted.
    noun: str
    plural: str
    #: A crashed cell is retried alone once, to tell FLAKY from FAILED.
    retries_crashes: bool
    #: Its jobs are worlds of ranks: the run's summary counts them as its worlds.
    starts_worlds: bool

    def devices_needed(self, entries: Sequence[Entry], platform: Platform,
                       pack: PackSpec | None = None) -> int:
        """cuda devices the job of ``entries`` holds while it runs (0: none)."""

    def job(self, name: str, entries: Sequence[Entry], platform: Platform,
            context: RunContext, devices: tuple[int, ...], *,
            packing: Packing | None = None) -> Job:
        """The job that runs ``entries`` (not started yet). ``packing``: the batch's,
        as planned (:attr:`Batch.packing`, parallel to ``entries``), run as given; None
        where there is none for exactly these entries (cells handed back, a retry): the
        job places them itself."""

    def describe(self, batch: Batch) -> str:
        """One line for ``--dry-run``: what the batch's job is."""

    def describe_cells(self, batch: Batch) -> list[str]:
        """``--dry-run``'s lines for the batch's cells, in the order they run."""

    def cache_identity(self) -> dict[str, str]:
        """What else a cached pass of this executor's cells depends on (a compiler's
        version, say): part of the action key."""


#: The executor among ``executors`` that runs cells of ``kind`` (KeyError for a kind none
#: of them runs): the plan stage's question, asked of the executors.
executor_for = planner_for
