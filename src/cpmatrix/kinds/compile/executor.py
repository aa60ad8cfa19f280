"""The compile executor: spill cells (``kind: spill``) in a compile subprocess, watched.

Spill cells need no world of ranks: each compiles one Triton kernel for one arch and
reads ``ptxas -v``. A :class:`CompileRun` runs a batch of them in one subprocess
(:mod:`cpmatrix.worker.compile_main`), without ``TRITON_INTERPRET``, writing the same typed
markers a world's rank 0 does. It is polled like a world: a cell past its timeout or a
compiler that dies fails that cell only, and the rest are handed back to run in a fresh
subprocess.

Example::

    >>> CompileExecutor().name, CompileExecutor().retries_crashes
    ('compile', False)
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from cpmatrix.fsutil import tail_lines
from cpmatrix.kinds.world.job import cell_spec
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.schema import Cell, Platform
from cpmatrix.module_names import COMPILE_MAIN
from cpmatrix.plan.batches import Batch, expected_s
from cpmatrix.plan.packing import Packing, PackSpec
from cpmatrix.plan.settings import PlanSettings
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.executors.launch import WORLD_TOKEN, Child, Progress
from cpmatrix.supervise.runners.base import Launch, hermetic_env
from cpmatrix.supervise.runners.local import LocalRunner
from cpmatrix.worker.protocol import CompileFolder, CompileJob, Outcome, write_typed

__all__ = ["CompileExecutor", "CompileRun"]

_FLAT = (int, float, str, bool)


def _evidence(raw: dict[str, Any]) -> dict[str, Any]:
    """Flat numbers and strings for the report (nested values become text)."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if isinstance(value, _FLAT):
            out[key] = value
        elif isinstance(value, dict):
            out[key] = ",".join(f"{k}={v}" for k, v in value.items())
        else:
            out[key] = str(value)
    # The names the gate and the HTML report read.
    if "stack_frame_bytes" in out:
        out.setdefault("stack_bytes", out["stack_frame_bytes"])
    return out


def _result(entry: Entry, done: Outcome) -> Result:
    evidence = _evidence(done.evidence)
    if done.ok:
        return Result(cell_id=entry.cell.id, status=Status.PASSED, evidence=evidence,
                      duration_s=done.duration_s, case_s=done.duration_s, message=done.message,
                      reads=done.reads)
    message = done.message or "spill gate failed"
    return Result(
        cell_id=entry.cell.id, status=Status.FAILED, kind=FailureKind.ERROR, failing_ranks=(0,),
        failures=(RankFailure(rank=0, message=message, traceback=done.traceback,
                              check="spill"),),
        evidence=evidence, duration_s=done.duration_s, message=message,
    )


class CompileRun:
    """One compile subprocess over ``entries``; poll it until ``finished``."""

    @property
    def token(self) -> str:
        return self.child.token

    def __init__(self, name: str, entries: Sequence[Entry], context: RunContext) -> None:
        self.name = name
        self.entries = list(entries)
        self.context = context
        self.devices: tuple[int, ...] = ()
        #: Its job file, log and markers (:mod:`cpmatrix.worker.protocol`).
        self.folder = CompileFolder(RunLayout(context.out_root).compile_job(name))
        self.progress = Progress(self.folder.progress, context.run_id)
        # Compiles need no isolation beyond the hermetic environment: always local.
        self.child = Child(f"{context.run_id or os.getpid()}/{name}", LocalRunner())
        self.finished = False
        self.remaining: list[Entry] = []
        self.start_failed = False
        self.start_error = ""
        self.lost = ""
        self._next = 0
        self._started: float | None = None

    def start(self) -> None:
        ctx = self.context
        try:
            if self.folder.path.exists():
                shutil.rmtree(self.folder.path)
            self.progress.folder.mkdir(parents=True)
            job = CompileJob(
                run_id=ctx.run_id, folder=str(self.folder.path),
                cache_dir=str(ctx.compile_cache) if ctx.compile_cache else None,
                search_path=list(ctx.pythonpath), out_root=str(ctx.out_root),
                cells=[cell_spec(e) for e in self.entries])
            write_typed(self.folder.job_file, job)
            home = str(self.folder.path)
            env = hermetic_env(ctx.source_env, home=home, tmp=home,
                               extra={"PYTHONPATH": os.pathsep.join(ctx.pythonpath),
                                      WORLD_TOKEN: self.child.token})
            env.pop("TRITON_INTERPRET", None)  # the compiler must see the real backend
            self.child.start(Launch(
                argv=(ctx.python, "-m", COMPILE_MAIN,
                      str(self.folder.job_file)),
                env=env, cwd=str(self.folder.path), name=self.name), self.folder.log)
        except OSError as exc:
            self.start_failed = True
            self.start_error = f"could not start the spill compiler: {exc}"
            self.remaining = list(self.entries)
            self.finished = True

    def poll(self) -> list[tuple[Entry, Result]]:
        if self.finished:
            return []
        self.progress.read()
        out: list[tuple[Entry, Result]] = []
        while self._next < len(self.entries):
            done = self.progress.dones.get((self._next, 0))
            if done is None:
                break
            out.append((self.entries[self._next], _result(self.entries[self._next], done)))
            self._next += 1
            self._started = None
        if self._next == len(self.entries):
            self.child.kill()
            self.finished = True
            return out
        entry = self.entries[self._next]
        if self._started is None and (self._next, 0) in self.progress.starts:
            self._started = time.monotonic()
        if self._started is not None and time.monotonic() - self._started > entry.cell.timeout_s:
            self.child.kill()
            out.append((entry, Result(
                cell_id=entry.cell.id, status=Status.TIMEOUT, kind=FailureKind.TIMEOUT,
                failing_ranks=(0,), message=f"compile ran past {entry.cell.timeout_s} s")))
            self._hand_back(self._next + 1)
        elif self.child.returncode() is not None:
            self.progress.read()
            if (self._next, 0) in self.progress.dones:
                return out + self.poll()  # it finished the cell as it exited
            tail = tail_lines(self.folder.log, lines=20)
            if (self._next, 0) not in self.progress.starts and self._next == 0:
                self.start_failed = True
                self.start_error = f"the spill compiler exited at once: {tail[-500:]}"
                self._hand_back(0)
                return out
            out.append((entry, Result(
                cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
                failing_ranks=(0,), stderr_tails={0: tail},
                message=f"the spill compiler died (exit {self.child.returncode()})")))
            self._hand_back(self._next + 1)
        return out

    def _hand_back(self, first: int) -> None:
        self.child.kill()
        self.remaining = self.entries[first:]
        self.finished = True

    def kill(self) -> None:
        self.child.kill()
        self.finished = True

    def queued(self) -> None:
        """A compile has no start-up clock to hold back."""

    def launcher_tail(self) -> str:
        return tail_lines(self.folder.log)


class CompileExecutor:
    """Spill cells: every one of a run in one compile subprocess (fresh after a fault)."""

    name = "compile"
    kinds: tuple[str, ...] = ("spill",)
    noun = "the spill compiler"
    plural = "compile jobs"
    #: A compile is deterministic: a crash is the compiler's, retried alone it would crash
    #: again. It fails the cell; the rest continue in a fresh subprocess.
    retries_crashes = False
    supports_mutants = False
    starts_worlds = False

    def plan(self, cells: Sequence[Cell], settings: PlanSettings, *,
             durations: Mapping[str, float], worlds: int = 1, pack: PackSpec | None = None,
             mutants: Mapping[str, Sequence[str]] | None = None) -> list[Batch]:
        # one compile job: its cells are seconds each, cached by digest
        if not cells:
            return []
        return [Batch(name="spill", platform=cells[0].platform, world_size=1,
                      cells=tuple(cells),
                      expected_s=sum(expected_s(c, durations) for c in cells))]

    def devices_needed(self, entries: Sequence[Entry], platform: Platform,
                       pack: PackSpec | None = None) -> int:
        return 0

    def job(self, name: str, entries: Sequence[Entry], platform: Platform,
            context: RunContext, devices: tuple[int, ...], *,
            packing: Packing | None = None) -> CompileRun:
        return CompileRun(name, entries, context)  # one subprocess: nothing to place

    def describe(self, batch: Batch) -> str:
        return (f"spill gates (compiled in one subprocess, no world): "
                f"{len(batch.cells)} cells")

    def describe_cells(self, batch: Batch) -> list[str]:
        return [f"  {c.id}  timeout={c.timeout_s}s" for c in batch.cells]

    def cache_identity(self) -> dict[str, str]:
        # A spill cell's numbers depend on the Triton version (and so its ptxas).
        try:
            return {"triton": version("triton")}
        except PackageNotFoundError:
            return {"triton": "absent"}
