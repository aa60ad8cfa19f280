"""This host's scheduler: ``--jobs`` worlds at once in the session's own loop, each cuda
platform one world over its GPUs.

Example::

    >>> from cpmatrix.supervise.options import RunOptions
    >>> HostScheduler(RunOptions()).name, HostScheduler(RunOptions()).whole_platform
    ('host', True)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.batches import slot_plan
from cpmatrix.plan.devices import visible_cuda_devices
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.runners.base import Runner
from cpmatrix.supervise.schedulers.base import Plans, Scheduling
from cpmatrix.supervise.session import JobPool
from cpmatrix.supervise.settings import SchedulerName

__all__ = ["HostScheduler"]


class HostScheduler:
    """This host: ``--jobs`` worlds at once, each cuda platform one world over its GPUs."""

    name: SchedulerName = "host"
    whole_platform: bool = True
    longest_first: bool = False

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

    def schedule(self, runner: Runner, out: Path, *, devices: int) -> Scheduling:
        return Scheduling(runner=runner, pool=self.pool(devices))

    def describe(self, plans: Plans) -> str:
        return slot_plan([b for _, bs in plans for b in bs], self.options.jobs,
                         where="host", unit="jobs", flag="--jobs")
