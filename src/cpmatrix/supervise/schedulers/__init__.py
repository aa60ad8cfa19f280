"""Where a run's worlds run: the schedulers, and the one place that picks one.

Two schedulers exist: :class:`HostScheduler` (this host's session loop, ``--jobs`` worlds
at once on its devices, :mod:`.host`) and :class:`SlurmScheduler` (each world one ``srun``
job on a node of its own, :mod:`.slurm`). :func:`scheduler_for` picks one from the options,
once per run; what a scheduler is asked: :class:`~.base.Scheduler`.

Example::

    >>> from cpmatrix.supervise.options import RunOptions
    >>> scheduler_for(RunOptions()).name, scheduler_for(RunOptions()).whole_platform
    ('host', True)
    >>> scheduler_for(RunOptions(scheduler="slurm", max_jobs=3)).pool(2)
    JobPool(jobs=3, devices=6, wrap_job=None)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.schedulers.base import Plans, Scheduler, Scheduling
from cpmatrix.supervise.schedulers.host import HostScheduler
from cpmatrix.supervise.schedulers.slurm import SlurmScheduler
from cpmatrix.supervise.settings import SchedulerName

__all__ = ["SCHEDULERS", "HostScheduler", "Plans", "Scheduler", "Scheduling", "SlurmScheduler",
           "scheduler_for"]


#: The schedulers by ``--scheduler`` name.
SCHEDULERS: Final[Mapping[SchedulerName, Callable[[RunOptions], Scheduler]]] = {
    "host": HostScheduler,
    "slurm": SlurmScheduler,
}


def scheduler_for(options: RunOptions) -> Scheduler:
    """The scheduler ``--scheduler`` names, over these options (:class:`UsageError` for
    flags it does not take: Slurm's without Slurm)."""
    return SCHEDULERS[options.scheduler](options)
