"""Where a run's worlds run: the :class:`Scheduler` protocol, picked once per run.

Two schedulers exist: :class:`HostScheduler` (this host's session loop, ``--jobs`` worlds
at once on its devices) and :class:`SlurmScheduler` (each world one ``srun`` job on a
node of its own, :mod:`cpmatrix.run.slurm`). :func:`scheduler_for` picks one from the
options; everything that differs between them is asked of it, so no other module
branches on ``--scheduler``: the preflight, whether a cuda platform stays one world,
what a missing device means, the device pool, the world split, the job wrapper and the
dry run's schedule.

Example::

    >>> from cpmatrix.run.options import RunOptions
    >>> scheduler_for(RunOptions()).name, scheduler_for(RunOptions()).whole_platform
    ('host', True)
    >>> scheduler_for(RunOptions(scheduler="slurm", max_jobs=3)).pool(2)
    JobPool(jobs=3, devices=6, worlds=None, wrap_job=None)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Protocol

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.batches import Batch, slot_plan
from cpmatrix.plan.devices import visible_cuda_devices
from cpmatrix.run.executors.base import Executor, Job
from cpmatrix.run.options import RunOptions
from cpmatrix.run.runners.base import Runner
from cpmatrix.run.session import JobPool
from cpmatrix.run.settings import SchedulerName
from cpmatrix.run.slurm import (
    SlurmJob,
    SlurmRunner,
    slurm_missing,
    slurm_plan,
    slurm_worlds,
)

__all__ = ["HostScheduler", "Scheduler", "Scheduling", "SlurmScheduler", "scheduler_for"]

Plans = Sequence[tuple[Executor, Sequence[Batch]]]


@dataclass(frozen=True)
class Scheduling:
    """What the session loop gets from the scheduler for one run."""

    #: The runner of the run's jobs (under Slurm: the run's runner inside srun).
    runner: Runner
    #: Jobs in flight at once, the devices their pool holds, the world split and the
    #: wrapper that makes each job the scheduler's own.
    pool: JobPool
    #: A line saying where the worlds run ("" for this host).
    note: str = ""


class Scheduler(Protocol):
    """Where the worlds of a run run."""

    name: SchedulerName
    #: A cuda platform's cells stay in one world over every GPU (this host's); else its
    #: worlds are split like any platform's (over nodes).
    whole_platform: bool

    def preflight(self) -> None:
        """Refuse (:class:`UsageError`) what cannot be scheduled, before ``--out`` is
        claimed (nothing for ``--dry-run``)."""

    def check_devices(self, *, needs: bool, devices: int) -> None:
        """Refuse cuda cells with no device in the pool; warn about ``--gpus`` more than
        this host has, where that matters."""

    def pool(self, devices: int) -> JobPool:
        """Jobs at once and the devices in the session's pool, for ``devices`` per world
        (no world split, no wrapper: :meth:`schedule` adds those)."""

    def worlds(self, cells: Sequence[Cell], durations: Callable[[], Mapping[str, float]]
               ) -> int:
        """How many worlds each platform's ``cells`` are split into."""

    def schedule(self, runner: Runner, out: Path, cells: Sequence[Cell], *, devices: int,
                 durations: Callable[[], Mapping[str, float]]) -> Scheduling:
        """The jobs' runner (``runner`` as this scheduler starts it), the pool, the world
        split and the job wrapper of a run into ``out``."""

    def describe(self, plans: Plans) -> str:
        """``--dry-run``'s schedule of the planned batches."""


class HostScheduler:
    """This host: ``--jobs`` worlds at once, each cuda platform one world over its GPUs."""

    name: SchedulerName = "host"
    whole_platform: bool = True

    def __init__(self, options: RunOptions) -> None:
        if options.slurm.given:
            raise UsageError("--partition, --account and --slurm-arg need --scheduler slurm")
        self.options = options

    def preflight(self) -> None:
        pass  # this host is always there

    def check_devices(self, *, needs: bool, devices: int) -> None:
        gpus = self.options.gpus
        if needs and devices == 0:
            raise UsageError("the selection has cuda cells but no CUDA device is visible "
                             "(use --dry-run to check the plan on a CPU machine)")
        if needs and gpus is not None:
            seen = visible_cuda_devices()
            if seen < gpus:
                print(f"warning: --gpus {gpus}, but {seen} CUDA devices are visible "
                      "here: a world given a device that is not there fails", file=sys.stderr)

    def pool(self, devices: int) -> JobPool:
        return JobPool(jobs=self.options.jobs, devices=devices)

    def worlds(self, cells: Sequence[Cell], durations: Callable[[], Mapping[str, float]]
               ) -> int:
        return self.options.jobs

    def schedule(self, runner: Runner, out: Path, cells: Sequence[Cell], *, devices: int,
                 durations: Callable[[], Mapping[str, float]]) -> Scheduling:
        return Scheduling(runner=runner, pool=replace(
            self.pool(devices), worlds=self.worlds(cells, durations)))

    def describe(self, plans: Plans) -> str:
        return slot_plan([b for _, bs in plans for b in bs], self.options.jobs,
                         where="host", unit="jobs", flag="--jobs")


class SlurmScheduler:
    """Each world one Slurm job (``srun``), ``--max-jobs`` at once, split by work."""

    name: SchedulerName = "slurm"
    whole_platform: bool = False

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.settings = options.slurm

    def preflight(self) -> None:
        missing = None if self.options.dry_run else slurm_missing()
        if missing is not None:
            raise UsageError(missing)

    def check_devices(self, *, needs: bool, devices: int) -> None:
        # The submit host's GPUs do not count: a node's are given with --gpus.
        if needs and devices == 0:
            raise UsageError("the selection has cuda cells: with --scheduler slurm, give "
                             "the GPUs of one node with --gpus N (the submit host's do "
                             "not count)")

    def pool(self, devices: int) -> JobPool:
        # Slurm places each job on a node with its own GPUs: the pool here only caps how
        # many cuda worlds are in flight (--max-jobs of them at most).
        return JobPool(jobs=self.settings.max_jobs, devices=devices * self.settings.max_jobs)

    def worlds(self, cells: Sequence[Cell], durations: Callable[[], Mapping[str, float]]
               ) -> int:
        return slurm_worlds(cells, durations(), self.settings.max_jobs)

    def schedule(self, runner: Runner, out: Path, cells: Sequence[Cell], *, devices: int,
                 durations: Callable[[], Mapping[str, float]]) -> Scheduling:
        srun = SlurmRunner(runner, self.settings)

        def wrap(job: Job) -> Job:
            return SlurmJob(job, srun)

        pool = replace(self.pool(devices), worlds=self.worlds(cells, durations), wrap_job=wrap)
        return Scheduling(
            runner=srun, pool=pool,
            note=f"scheduler: slurm (each world one srun job, at most {pool.jobs} at once; "
                 f"--out {out} must be shared with the nodes)")

    def describe(self, plans: Plans) -> str:
        return slurm_plan(plans, self.settings.max_jobs)


#: The schedulers by ``--scheduler`` name.
SCHEDULERS: Final[Mapping[SchedulerName, Callable[[RunOptions], Scheduler]]] = {
    "host": HostScheduler,
    "slurm": SlurmScheduler,
}


def scheduler_for(options: RunOptions) -> Scheduler:
    """The scheduler ``--scheduler`` names, over these options (:class:`UsageError` for
    flags it does not take: Slurm's without Slurm)."""
    return SCHEDULERS[options.scheduler](options)
