"""The scheduler protocol (host, Slurm) and the settings sections, with fakes: no process."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.result import Result
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.runners.base import Launch, Runner
from cpmatrix.supervise.runners.local import LocalRunner
from cpmatrix.supervise.schedulers import HostScheduler, SlurmScheduler, scheduler_for
from cpmatrix.supervise.schedulers.slurm import JobState, SlurmJob, SlurmRunner
from cpmatrix.supervise.settings import FaultTimings, SlurmSettings
from cpmatrix.worker.procs import WORLD_TOKEN


def test_the_scheduler_is_picked_once_from_the_options() -> None:
    assert isinstance(scheduler_for(RunOptions()), HostScheduler)
    assert isinstance(scheduler_for(RunOptions(scheduler="slurm")), SlurmScheduler)
    assert scheduler_for(RunOptions()).whole_platform
    assert not scheduler_for(RunOptions(scheduler="slurm")).whole_platform


def test_slurm_flags_without_slurm_are_refused() -> None:
    with pytest.raises(UsageError, match="need --scheduler slurm"):
        scheduler_for(RunOptions(partition="gpu"))
    scheduler_for(RunOptions(scheduler="slurm", partition="gpu"))  # fine with Slurm


@pytest.mark.parametrize(("options", "pool"), [
    (RunOptions(jobs=3), (3, 4)),
    (RunOptions(scheduler="slurm", max_jobs=2), (2, 8)),  # each job a node of 4 GPUs
])
def test_the_pool(options: RunOptions, pool: tuple[int, int]) -> None:
    got = scheduler_for(options).pool(4)
    assert (got.jobs, got.devices) == pool


def test_no_device_is_a_usage_error_naming_what_to_do() -> None:
    with pytest.raises(UsageError, match="no CUDA device is visible"):
        scheduler_for(RunOptions()).check_devices(needs=True, devices=0)
    with pytest.raises(UsageError, match="--gpus N"):
        scheduler_for(RunOptions(scheduler="slurm")).check_devices(needs=True, devices=0)


def test_the_sections_carry_the_flags() -> None:
    o = RunOptions(abort_grace_s=2.0, partition="p", slurm_args=("--time=3",), max_jobs=5,
                   batch_size=4, keep_order=True, runs_per_test=2)
    assert o.timings == FaultTimings(abort_grace_s=2.0)
    assert o.slurm == SlurmSettings(partition="p", extra_args=("--time=3",), max_jobs=5)
    assert (o.planning.batch_size, o.planning.keep_order, o.planning.runs) == (4, True, 2)
    assert RunOptions().timings == FaultTimings()  # one default, the section's


@dataclass
class _FakeJob:
    """A Job that never finishes on its own and counts the wrapper's queued() calls."""

    name: str = "003-cpu-w1-b0.a1"
    token: str = "r1/003-cpu-w1-b0.a1"
    #: The runner its launch goes through (None: one that never reaches Slurm, a compile
    #: job on this host).
    runner: Runner | None = None
    entries: list[Entry] = field(default_factory=list)
    devices: tuple[int, ...] = ()
    finished: bool = False
    remaining: list[Entry] = field(default_factory=list)
    start_failed: bool = False
    start_error: str = ""
    lost: str = ""
    queued_calls: int = 0

    def start(self) -> None:
        if self.runner is not None and not self.start_failed:  # as WorldRun's Child does
            self.runner.command(Launch(argv=("true",), env={WORLD_TOKEN: self.token},
                                       cwd=".", name=self.name))

    def queued(self) -> None:
        self.queued_calls += 1

    def poll(self) -> list[tuple[Entry, Result]]:
        return []

    def kill(self) -> None:
        pass

    def launcher_tail(self) -> str:
        return ""


def test_a_pending_slurm_job_holds_its_worlds_clock_and_is_named_by_its_scheduler() -> None:
    runner = SlurmRunner(LocalRunner(), SlurmSettings())
    states = {"cpmatrix-r1-003-cpu-w1-b0.a1": JobState("7", "PENDING", "Priority")}
    runner.state = lambda name, fresh=False: states.get(name)  # type: ignore[method-assign]
    inner = _FakeJob(runner=runner)
    job = SlurmJob(inner, runner)
    job.start()
    assert job.slurm_name == "cpmatrix-r1-003-cpu-w1-b0.a1"
    assert job.slurm_name in runner.watching
    job.poll()
    job.poll()
    assert inner.queued_calls == 2  # the world's start-up clock restarts while queued
    states[job.slurm_name] = JobState("7", "RUNNING", "None")
    job.poll()
    assert inner.queued_calls == 2 and job.running
    assert job.slurm_name not in runner.watching


def test_a_job_that_never_started_is_not_watched() -> None:
    runner = SlurmRunner(LocalRunner(), SlurmSettings())
    job = SlurmJob(_FakeJob(start_failed=True, runner=runner), runner)
    job.start()
    assert job.slurm_name == "" and not runner.watching


def test_a_job_that_runs_here_is_not_watched() -> None:
    """A compile job runs on this host (its own LocalRunner): Slurm never hears its name,
    so it is never asked about (nor cancelled) as if it were a Slurm job."""
    runner = SlurmRunner(LocalRunner(), SlurmSettings())
    inner = _FakeJob(token="r1/spill-0")
    job = SlurmJob(inner, runner)
    job.start()
    assert job.slurm_name == "" and not runner.watching and not runner.submitted


@pytest.mark.parametrize(("options", "longest_first"), [
    (RunOptions(), False), (RunOptions(scheduler="slurm", dry_run=True), True)])
def test_the_plans_launch_order_is_the_schedulers(tmp_path: Path, options: RunOptions,
                                                  longest_first: bool) -> None:
    """Slurm's job slots each take the longest world left: its plans launch longest
    first; this host's in the planners' order (``repro``: always, it is not scheduled)."""
    from cpmatrix.kinds.executors import EXECUTORS
    from cpmatrix.matrix.schema import Cell, Mesh, Platform
    from cpmatrix.supervise.assembly import Front, place_cells
    from cpmatrix.supervise.sharding import Recorded

    cell = Cell(id="t[unit,1x1,fp64,autocast=off,reference]@cpu", target="t", case="m:f",
                kind="parity", level="unit", mesh=Mesh.parse("1x1"), dtype="fp64",
                autocast=False, path="reference", params=(), platform="cpu", timeout_s=60,
                tags=())
    platforms = {"cpu": Platform(name="cpu", backend="gloo", device="cpu")}

    def placed(front: Front) -> bool:
        return place_cells(options, [cell], platforms, scheduler=scheduler_for(options),
                           recorded=Recorded(options, tmp_path), executors=EXECUTORS,
                           front=front).longest_first

    assert placed(Front()) is longest_first
    assert placed(Front(scheduled=False)) is False
