"""What a scheduler is: the :class:`Scheduler` protocol and the :class:`Scheduling` it
hands the session loop for one run.

Everything that differs between this host and Slurm is asked of a scheduler, so no other
module branches on ``--scheduler``: the preflight, whether a cuda platform stays one world,
what a missing device means, the device pool, the world split, the job wrapper and the
dry run's schedule. The schedulers themselves: :mod:`.host`, :mod:`.slurm`; the choice
among them: :func:`cpmatrix.supervise.schedulers.scheduler_for`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.batches import Batch
from cpmatrix.supervise.executors.base import Executor
from cpmatrix.supervise.runners.base import Runner
from cpmatrix.supervise.session import JobPool
from cpmatrix.supervise.settings import SchedulerName

__all__ = ["Plans", "Scheduler", "Scheduling"]

#: The planned batches of a run, by executor (what ``--dry-run``'s schedule describes).
Plans = Sequence[tuple[Executor, Sequence[Batch]]]


@dataclass(frozen=True)
class Scheduling:
    """What the session loop gets from the scheduler for one run."""

    #: The runner of the run's jobs (under Slurm: the run's runner inside srun).
    runner: Runner
    #: Jobs in flight at once, the devices their pool holds and the wrapper that makes
    #: each job the scheduler's own (the world split is the plan's: :meth:`worlds`).
    pool: JobPool
    #: A line saying where the worlds run ("" for this host).
    note: str = ""


class Scheduler(Protocol):
    """Where the worlds of a run run."""

    name: SchedulerName
    #: A cuda platform's cells stay in one world over every GPU (this host's); else its
    #: worlds are split like any platform's (over nodes).
    whole_platform: bool
    #: Its jobs start longest-expected first (:attr:`cpmatrix.plan.plan.Placement.longest_first`):
    #: jobs that queue elsewhere each take the longest world left when a slot frees.
    longest_first: bool

    def preflight(self) -> None:
        """Refuse (:class:`UsageError`) what cannot be scheduled, before ``--out`` is
        claimed (nothing for ``--dry-run``)."""

    def check_devices(self, *, needs: bool, devices: int) -> None:
        """Refuse cuda cells with no device in the pool; warn about ``--gpus`` more than
        this host has, where that matters."""

    def pool(self, devices: int) -> JobPool:
        """Jobs at once and the devices in the session's pool, for ``devices`` per world
        (no wrapper: :meth:`schedule` adds it)."""

    def worlds(self, cells: Sequence[Cell], durations: Callable[[], Mapping[str, float]]
               ) -> int:
        """How many worlds each platform's ``cells`` are split into (asked once per run,
        for its plan: :class:`~cpmatrix.plan.plan.Placement`)."""

    def schedule(self, runner: Runner, out: Path, *, devices: int) -> Scheduling:
        """The jobs' runner (``runner`` as this scheduler starts it), the pool and the job
        wrapper of a run into ``out``."""

    def describe(self, plans: Plans) -> str:
        """``--dry-run``'s schedule of the planned batches."""
