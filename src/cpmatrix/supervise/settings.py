"""A run's settings as sections: each a frozen dataclass, defined once, shared.

:class:`~cpmatrix.supervise.options.RunOptions` is the command line (one field per flag); the
run reads it through these sections (``options.timings``, ``options.slurm``,
``options.planning``, ``options.caching``), and :class:`~cpmatrix.supervise.context.RunContext`
carries the same :class:`FaultTimings` to the jobs. The plan's and the cache's sections are
their stages' own (:class:`~cpmatrix.plan.settings.PlanSettings`,
:class:`~cpmatrix.cache.settings.CacheSettings`). A section's defaults are its own:
``RunOptions`` takes each flag's default from its section (``--jobs``, ``--launcher`` and
the like, which belong to no section, keep theirs there).

The choice options are ``Literal`` types; :func:`choices` gives their values for argparse
and for the messages that refuse another.

Example::

    >>> FaultTimings().abort_grace_s, SlurmSettings(partition="gpu").pending_timeout_s
    (5.0, 600.0)
    >>> choices(Launcher)
    ('fork', 'torchrun')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

# The cache's section is the cache's own (cpmatrix.cache sits below the supervisor).
from cpmatrix.cache.settings import CacheSettings

__all__ = ["CacheSettings", "FaultTimings", "Launcher", "Packing", "RunnerChoice", "SchedulerName",
           "SlurmSettings", "choices"]

#: How a world's ranks are started (see docs/worlds.md for the measured choice).
Launcher = Literal["fork", "torchrun"]
#: How a world places its cells on its ranks (see docs/worlds.md).
Packing = Literal["slots", "serial"]
#: Where worlds run: this host's loop, or each world a Slurm job.
SchedulerName = Literal["host", "slurm"]
#: How a world's process tree is isolated (``auto``: docker > sandbox > local).
RunnerChoice = Literal["local", "sandbox", "docker", "auto"]


def choices(kind: Any) -> tuple[str, ...]:
    """The values of a ``Literal`` choice type, in their order.

    >>> choices(SchedulerName)
    ('host', 'slurm')
    """
    return tuple(get_args(kind))


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultTimings:
    """How long a world may take at each step before cpmatrix acts (seconds)."""

    #: After one rank fails a cell, how long the others may take to finish it.
    abort_grace_s: float = 5.0
    #: How long a world may take to start its first cell.
    startup_timeout_s: float = 180.0
    #: After every cell of a world is in, how long its ranks may take to exit.
    teardown_grace_s: float = 20.0
    #: After a rank died, how long torchrun may take to tear the world down itself.
    dead_rank_grace_s: float = 3.0
    #: Between the stack-dump request (SIGUSR1) and the kill.
    dump_wait_s: float = 1.5


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmSettings:
    """Where and how the Slurm jobs are submitted (``--partition``, ``--account``, ...)."""

    partition: str | None = None
    account: str | None = None
    extra_args: tuple[str, ...] = ()
    pending_timeout_s: float = 600.0
    #: Slurm jobs in flight at once (``--max-jobs``).
    max_jobs: int = 8

    @property
    def given(self) -> bool:
        """Whether any Slurm-only flag was given (they need the Slurm scheduler)."""
        return bool(self.partition or self.account or self.extra_args)
