"""The Slurm scheduler: each world a Slurm job, started with ``srun`` as one gang.

Two pieces wrap what runs on this host, so the executors and the session loop are the
same for both schedulers:

- :class:`SlurmRunner` wraps the run's runner (local, sandbox, docker): the command it
  would run becomes the one task of a one-node ``srun`` job (``--nodes=1 --ntasks=1``,
  ``--gres=gpu:N`` for a cuda world), so the launcher and its ranks start inside the
  allocation exactly as they do here, with the same environment allow-list. Its pids are
  another node's, so they are never signalled (``shares_pid_namespace = False``): faults
  are read from the typed start/done files on the shared ``--out`` and the launcher's log.
- :class:`SlurmJob` wraps one executor job and adds what only Slurm knows: a job still
  PENDING past ``pending_timeout_s`` fails its cells with a clear message (the world's
  start-up clock only runs once Slurm runs it); a job Slurm ended (``scancel``, time
  limit, node failure, preemption) blames none of its cells: every cell in flight runs
  again, with the rest, in a new job (:data:`cpmatrix.supervise.session.LOST_RETRIES` times at
  most; then they end ``infra``, which no gate policy accepts); killing the job
  ``scancel``\\ s it.

Example::

    >>> from cpmatrix.supervise.runners.local import LocalRunner
    >>> from cpmatrix.supervise.runners.base import Launch
    >>> r = SlurmRunner(LocalRunner(), SlurmSettings(partition="gpu", extra_args=("--time=30",)))
    >>> r.command(Launch(argv=("torchrun", "x"), env={}, cwd="/", name="w1"))[0]
    ['srun', '--job-name=w1', '--nodes=1', '--ntasks=1', '--kill-on-bad-exit=1', \
'--export=ALL', '--partition=gpu', '--time=30', 'torchrun', 'x']
"""

from __future__ import annotations

import getpass
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.batches import Batch, expected_s, slot_plan
from cpmatrix.result import FailureKind, Result, Status
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.executors.base import Executor, Job
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.runners.base import Launch, Runner
from cpmatrix.supervise.schedulers.base import Plans, Scheduling
from cpmatrix.supervise.session import JobPool
from cpmatrix.supervise.settings import SchedulerName, SlurmSettings
from cpmatrix.worker.procs import WORLD_TOKEN

__all__ = ["ENDED_BY_SLURM", "MIN_JOB_S", "JobState", "SlurmJob", "SlurmRunner", "SlurmScheduler",
           "job_name_of", "parse_states", "query_states", "slurm_missing", "slurm_plan",
           "slurm_worlds"]

#: Job states in which Slurm, not the world, ended the job.
ENDED_BY_SLURM: Final = frozenset({"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"})
#: States that are not final yet; how long a crashed world's job may take to settle.
UNSETTLED: Final = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT",
                              "SIGNALING"})
SETTLE_S: Final = 15.0
#: What srun needs from the caller's environment to reach the cluster (not the world's).
SRUN_ENV: Final = ("SLURM_CONF",)
#: The expected work a Slurm job should carry before a platform's cells are split over
#: more jobs: each job pays Slurm's scheduling and a world start (seconds), so a split
#: into jobs of a few seconds' work would cost more than it saves.
MIN_JOB_S: Final = 60.0
#: How often Slurm is asked about the run's jobs (one squeue for all of them).
QUERY_EVERY_S: Final = 1.0


def slurm_missing() -> str | None:
    """None when srun, squeue and scancel are on PATH; else which are not."""
    missing = [t for t in ("srun", "squeue", "scancel") if shutil.which(t) is None]
    if missing:
        return (f"--scheduler slurm needs {', '.join(missing)} on PATH (a Slurm client: "
                "run on a login node, or see docs/scale.md)")
    return None


def job_name(launch: Launch) -> str:
    """``cpmatrix-<run id>-<world>``: unique across runs and submit hosts (the run id is
    random), so squeue and scancel by name touch this run's job only.

    >>> job_name(Launch(argv=(), env={WORLD_TOKEN: "ab12/003-cpu-w2-b0.a1"}, cwd="/"))
    'cpmatrix-ab12-003-cpu-w2-b0.a1'
    """
    token = launch.env.get(WORLD_TOKEN, "")
    return job_name_of(token) if token else _safe(launch.name)


def job_name_of(token: str) -> str:
    """The Slurm job name of the world whose token (``<run id>/<job>``) is ``token``.

    >>> job_name_of("ab12/003-cpu-w2-b0.a1")
    'cpmatrix-ab12-003-cpu-w2-b0.a1'
    """
    return _safe(f"cpmatrix-{token}")


def _safe(raw: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in raw)


@dataclass(frozen=True, slots=True)
class JobState:
    """One row of squeue."""

    job_id: str
    state: str
    reason: str


class SlurmRunner:
    """The inner runner's command as the single task of a one-node ``srun`` job."""

    shares_pid_namespace = False

    def __init__(self, inner: Runner, settings: SlurmSettings) -> None:
        self.inner = inner
        self.settings = settings
        self.name = inner.name  # the runner that isolates the world, as reported
        self.private_files = inner.private_files
        #: Job names submitted by this run, in order; cancelled ones (by cpmatrix);
        #: the ones whose state is still of interest (asked about together).
        self.submitted: list[str] = []
        self.watching: set[str] = set()
        self.cancelled: set[str] = set()
        self._states: dict[str, JobState] = {}
        self._asked_at = 0.0

    def unavailable(self) -> str | None:
        return slurm_missing() or self.inner.unavailable()

    def identity(self) -> dict[str, str]:
        # Where a world runs does not change what it computes: cached passes are shared
        # between the schedulers (and between the jobs of one run, see docs/scale.md).
        return self.inner.identity()

    def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
        cmd, env = self.inner.command(launch)
        s = self.settings
        name = job_name(launch)
        # --export=ALL: the task gets exactly srun's environment, which is the world's
        # hermetic one (a site default of SLURM_EXPORT_ENV=NONE would otherwise drop it).
        argv = ["srun", f"--job-name={name}", "--nodes=1", "--ntasks=1",
                "--kill-on-bad-exit=1", "--export=ALL"]
        if launch.devices:
            # Slurm picks the node's GPUs and sets CUDA_VISIBLE_DEVICES in the task; the
            # submit host's device numbers mean nothing there.
            argv.append(f"--gres=gpu:{len(launch.devices)}")
            env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        if s.partition:
            argv.append(f"--partition={s.partition}")
        if s.account:
            argv.append(f"--account={s.account}")
        argv += [*s.extra_args, *cmd]
        # srun itself must find the cluster's configuration where it is not the default.
        env = {**env, **{k: os.environ[k] for k in SRUN_ENV if k in os.environ}}
        self.submitted.append(name)
        return argv, env

    def cleanup(self, launch: Launch) -> None:
        """The world was killed by cpmatrix: cancel its job (killing srun does not)."""
        self.cancel(job_name(launch))
        self.inner.cleanup(launch)

    def cancel(self, name: str) -> None:
        """scancel the job; remember that cpmatrix ended it, unless Slurm already had (a
        world torn down because Slurm killed its ranks is still Slurm's doing)."""
        st = self.state(name, fresh=True)
        if st is None or st.state not in ENDED_BY_SLURM:
            self.cancelled.add(name)
        try:
            # By name and user: names carry the run id, so only this run's job matches
            # (as root, a bare --name could reach another user's job).
            subprocess.run(["scancel", f"--name={name}", f"--user={getpass.getuser()}"],
                           capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"warning: scancel of Slurm job {name} failed: {exc}", file=sys.stderr)

    def state(self, name: str, fresh: bool = False) -> JobState | None:
        """The job's state: one squeue call at most every QUERY_EVERY_S for all the jobs
        being watched (``fresh``: ask now)."""
        now = time.monotonic()
        if fresh or now - self._asked_at >= QUERY_EVERY_S:
            self._asked_at = now
            self._states = query_states(sorted(self.watching | {name}))
        return self._states.get(name)


def query_states(names: Sequence[str]) -> dict[str, JobState]:
    """Job name -> state, from squeue (which keeps ended jobs for MinJobAge, 300 s by
    default), and from sacct for a name squeue no longer knows (where the cluster keeps
    accounting; without it, sacct fails and the name is simply unknown)."""
    if not names:
        return {}
    states = _ask(["squeue", "--noheader", "--states=all", f"--name={','.join(names)}",
                   "--format=%j|%i|%T|%r"])
    gone = [n for n in names if n not in states]
    if gone:
        found = _ask(["sacct", "--noheader", "--allocations", "--parsable2",
                      f"--name={','.join(gone)}", "--format=JobName,JobID,State,Reason"])
        states.update({n: st for n, st in found.items() if n in gone})
    return states


def _ask(argv: list[str]) -> dict[str, JobState]:
    """``name|id|state|reason`` rows -> states; nothing when the tool fails.

    sacct writes a cancel as ``CANCELLED by 0``: the state is the first word.
    """
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    return parse_states(proc.stdout)


def parse_states(text: str) -> dict[str, JobState]:
    """Rows of ``name|id|state|reason``; the last row of a name wins.

    >>> parse_states("w1|42|CANCELLED by 0|None\\nnoise\\nw2|43|PENDING|BeginTime\\n")
    {'w1': JobState(job_id='42', state='CANCELLED', reason='None'), \
'w2': JobState(job_id='43', state='PENDING', reason='BeginTime')}
    """
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[2]:
            states[parts[0]] = JobState(job_id=parts[1], state=parts[2].split()[0],
                                        reason=parts[3])
    return states


class SlurmJob:
    """One executor job run as a Slurm job: pending limit, Slurm's verdict, scancel.

    ``slurm_name`` is the name its launch was submitted under (:func:`job_name_of` its
    token, as :meth:`SlurmRunner.command` names it), "" until it was.
    """

    def __init__(self, inner: Job, runner: SlurmRunner) -> None:
        self.inner = inner
        self.runner = runner
        self.slurm_name = ""
        self.submitted_at = 0.0
        self.running = False
        self._pending_failed = False
        #: Why Slurm ended the job ("" if it did not); the cell the world blamed for it,
        #: handed back to run again.
        self._lost = ""
        self._rerun: list[Entry] = []

    # The Job protocol, delegated.
    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def entries(self) -> list[Entry]:
        return self.inner.entries

    @property
    def devices(self) -> tuple[int, ...]:
        return self.inner.devices

    @property
    def finished(self) -> bool:
        return self._pending_failed or self.inner.finished

    @property
    def remaining(self) -> list[Entry]:
        if self._pending_failed:
            return []
        return [*self._rerun, *self.inner.remaining]

    @property
    def lost(self) -> str:
        return self._lost

    @property
    def start_failed(self) -> bool:
        return not self._pending_failed and self.inner.start_failed

    @property
    def start_error(self) -> str:
        return self.inner.start_error

    @property
    def token(self) -> str:
        return self.inner.token

    def launcher_tail(self) -> str:
        return self.inner.launcher_tail()

    def queued(self) -> None:
        self.inner.queued()

    def start(self) -> None:
        self.inner.start()
        # Slurm knows the name once the launch was submitted under it (a job that failed
        # before srun, or one that runs here, such as a compile job, never was).
        name = job_name_of(self.inner.token)
        if name in self.runner.submitted:
            self.slurm_name = name
            self.runner.watching.add(self.slurm_name)
        self.submitted_at = time.monotonic()

    def poll(self) -> list[tuple[Entry, Result]]:
        if self.finished:
            return []
        if self.slurm_name and not self.running:
            st = self.runner.state(self.slurm_name)
            if st is not None and st.state == "PENDING":
                waited = time.monotonic() - self.submitted_at
                if waited > self.runner.settings.pending_timeout_s:
                    return self._fail_pending(st, waited)
                # Queue time is not start-up time: the world's clock starts with the job.
                self.inner.queued()
                return []
            if st is not None:
                # Running: the world's own files say the rest, until it ends (then one
                # fresh question for Slurm's verdict).
                self.running = True
                self.runner.watching.discard(self.slurm_name)
        results = self.inner.poll()
        if self.inner.finished and self.slurm_name \
                and self.slurm_name not in self.runner.cancelled:
            results = self._slurm_verdict(results)
        return results

    def _fail_pending(self, st: JobState, waited: float) -> list[tuple[Entry, Result]]:
        self.runner.cancel(self.slurm_name)
        self.runner.watching.discard(self.slurm_name)
        self.inner.kill()
        self._pending_failed = True
        # "could not start": infrastructure, so it is not retried alone (another wait).
        msg = (f"could not start: Slurm job {st.job_id} ({self.slurm_name}) was still "
               f"PENDING after "
               f"{waited:.0f} s (reason: {st.reason}); cancelled, its cells were not run "
               f"(--pending-timeout {self.runner.settings.pending_timeout_s:g})")
        return [(e, Result(cell_id=e.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
                           message=msg, mutant=e.mutant, attempts=e.attempt,
                           out_dir=e.out_dir)) for e in self.inner.entries]

    def _slurm_verdict(self, results: list[tuple[Entry, Result]]
                       ) -> list[tuple[Entry, Result]]:
        """A world that died because Slurm ended its job blames none of its cells: the
        crash the world blamed (its earliest cell in flight, as nobody was seen dying) is
        taken back, and that cell runs again with the others, in a new job."""
        if not any(r.status is Status.CRASH for _, r in results):
            return results
        st = self.runner.state(self.slurm_name, fresh=True)
        deadline = time.monotonic() + SETTLE_S
        # Right after scancel a job may still read COMPLETING (or RUNNING): its final
        # state, the one that says who ended it, follows within Slurm's KillWait.
        while st is not None and st.state in UNSETTLED and time.monotonic() < deadline:
            time.sleep(0.5)
            st = self.runner.state(self.slurm_name, fresh=True)
        if st is None or st.state not in ENDED_BY_SLURM:
            return results
        why = f"Slurm ended job {st.job_id} ({st.state}"
        why += f", {st.reason})" if st.reason and st.reason != "None" else ")"
        self._lost = why
        self._rerun = [e for e, r in results if r.status is Status.CRASH]
        return [(e, r) for e, r in results if r.status is not Status.CRASH]

    def kill(self) -> None:
        # scancel first: the job then ends CANCELLED (killing srun first would leave it
        # to Slurm to notice), and its processes on the node get Slurm's SIGTERM/SIGKILL.
        if self.slurm_name:
            self.runner.cancel(self.slurm_name)
        self.inner.kill()


def slurm_worlds(cells: Sequence[Cell], durations: Mapping[str, float], max_jobs: int) -> int:
    """How many worlds (jobs) to split each platform's cells into: one per ``MIN_JOB_S``
    of expected work (recorded durations, else a sixtieth of the timeout), at most
    ``max_jobs``, at least one.

    >>> from cpmatrix.matrix.schema import Mesh
    >>> c = Cell(id="a", target="t", case="m:f", kind="parity", level="unit",
    ...     mesh=Mesh.parse("1x1"), dtype="fp64", autocast=False, path="reference",
    ...     params=(), platform="cpu", timeout_s=60, tags=())
    >>> slurm_worlds([c], {"a": 500.0}, 8), slurm_worlds([c], {"a": 5.0}, 8)
    (8, 1)
    """
    work = sum(expected_s(c, durations) for c in cells)
    return max(1, min(max_jobs, math.ceil(work / MIN_JOB_S)))


def slurm_plan(plans: Sequence[tuple[Executor, Sequence[Batch]]], max_jobs: int) -> str:
    """``--dry-run`` with Slurm: the worlds on ``max_jobs`` job slots, longest first, and
    the expected makespan (see :func:`cpmatrix.plan.batches.slot_plan`)."""
    return slot_plan([b for _, bs in plans for b in bs], max_jobs,
                     where="slurm", unit="jobs (one per world)", flag="--max-jobs")


class SlurmScheduler:
    """Each world one Slurm job (``srun``), ``--max-jobs`` at once, split by work."""

    name: SchedulerName = "slurm"
    whole_platform: bool = False
    longest_first: bool = True

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

    def schedule(self, runner: Runner, out: Path, *, devices: int) -> Scheduling:
        srun = SlurmRunner(runner, self.settings)

        def wrap(job: Job) -> Job:
            return SlurmJob(job, srun)

        pool = replace(self.pool(devices), wrap_job=wrap)
        return Scheduling(
            runner=srun, pool=pool,
            note=f"scheduler: slurm (each world one srun job, at most {pool.jobs} at once; "
                 f"--out {out} must be shared with the nodes)")

    def describe(self, plans: Plans) -> str:
        return slurm_plan(plans, self.settings.max_jobs)
