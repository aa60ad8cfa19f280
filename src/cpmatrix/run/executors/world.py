"""The supervisor: launches worlds, watches them, attributes every fault to one cell.

A :class:`WorldRun` is one torchrun launch of some cells. It is polled; it never
blocks. It reads the workers' start markers and atomic outcome files, watches the
rank pids, and decides:

- all ranks wrote an outcome for a cell -> that cell's result (passed/failed);
- some rank failed a cell and the others did not finish it within ``abort_grace_s``
  (they wait in a collective the failing rank skipped) -> the world is torn down,
  the cell fails with kind ``error`` naming the failing rank(s);
- a cell ran past its timeout -> every rank's Python stacks are dumped (SIGUSR1 +
  faulthandler) into the cell's folder, the world is killed, kind ``timeout``;
- a rank died -> kind ``crash`` for the cell it was running, naming that rank and
  its exit status;
- the world never started (port clash, torch missing, disk full) -> retried, then
  every cell of it fails with the launcher's error.

Cells after the faulty one are handed back to be run in a fresh world, so no cell is
reported failed because of another cell's fault.

Every file the supervisor reads carries its run's id; a marker of another run (a second
``cpmatrix run`` on the same folder) is ignored. When a world ends, every process that
carries its token in the environment is killed (see :mod:`cpmatrix.remote.procs`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpmatrix.fsutil import atomic_write_json, read_json, tail_lines
from cpmatrix.matrix.schema import Cell, Platform
from cpmatrix.remote.procs import WORLD_TOKEN, descendants, kill_all, processes_with_token
from cpmatrix.report.junit import testcase_name
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.run.runners.base import Launch, Runner, hermetic_env

__all__ = ["Entry", "WorldOptions", "WorldRun", "free_port"]

_TAIL_LINES = 30
#: Messages of a rank whose peer went away: a consequence, not the cause.
_COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"communicator was aborted|Timed out waiting|ProcessGroupGloo.*closed",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One cell to run in a world (optionally with a mutant switched on)."""

    cell: Cell
    mutant: str = ""
    attempt: int = 1

    @property
    def key(self) -> str:
        return testcase_name(self.cell.id, self.mutant)

    @property
    def out_dir(self) -> str:
        base = f"cells/{cell_folder(self.cell.id)}"
        return f"{base}/mutant-{cell_folder(self.mutant)}" if self.mutant else base


#: File names may hold 255 bytes; an id longer than this gets a digest-based name.
_MAX_FOLDER_BYTES = 160


def cell_folder(name: str) -> str:
    """A file name for a cell id: the id itself, or a prefix and a digest when too long.

    >>> cell_folder("t[unit,1x1,fp64,autocast=off,reference]@cpu")
    't[unit,1x1,fp64,autocast=off,reference]@cpu'
    >>> len(cell_folder("t" * 300)), cell_folder("t" * 300)[-17:-16]
    (113, '~')
    """
    if len(name.encode()) <= _MAX_FOLDER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name.encode()[:96].decode(errors='ignore')}~{digest}"


@dataclass(frozen=True, kw_only=True)
class WorldOptions:
    out_root: Path
    runner: Runner
    python: str = sys.executable
    pythonpath: tuple[str, ...] = ()
    #: The matrix's own pythonpath folders: modules a cell imports from them are
    #: re-imported afresh for the next cell (see :mod:`cpmatrix.remote.isolation`).
    project_roots: tuple[str, ...] = ()
    project_root: str = "."
    #: This run's id: stamped on every world file and marker, checked when read.
    run_id: str = ""
    abort_grace_s: float = 5.0
    startup_timeout_s: float = 180.0
    #: Seconds between SIGUSR1 (stack dump) and the kill.
    dump_wait_s: float = 1.5
    source_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Starts torchrun with the parent-death signal set: if cpmatrix dies, even by SIGKILL,
#: the kernel kills torchrun (and each rank then dies with torchrun). argv: the expected
#: parent pid, then the command.
_TRAMPOLINE = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _pid_alive(pid: int) -> bool:
    """True while the process runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _exit_status(pid: int) -> int | None:
    """The raw wait status of a zombie from /proc (field 52), if we catch it in time."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[49]) if len(fields) > 49 else None
    except (OSError, ValueError, IndexError):
        return None


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {name}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.DOTALL)


def _torchrun_root_cause(log_text: str) -> tuple[int, str] | None:
    """The rank and exit code torchrun names as the first observed failure."""
    idx = log_text.rfind("Root Cause")
    if idx < 0:
        return None
    m = _ROOT_CAUSE.search(log_text, idx)
    if m is None:
        return None
    code = int(m.group(2))
    if code < 0:
        try:
            how = f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return int(m.group(1)), how


class WorldRun:
    """One torchrun launch over ``entries``; poll it until ``finished``."""

    def __init__(
        self,
        name: str,
        entries: Sequence[Entry],
        platform: Platform,
        options: WorldOptions,
        devices: tuple[int, ...] = (),
    ) -> None:
        assert entries, "a world needs at least one cell"
        self.name = name
        self.entries = list(entries)
        self.platform = platform
        self.options = options
        self.devices = devices
        self.world_size = entries[0].cell.world_size
        self.dir = options.out_root / "worlds" / name
        self.progress = self.dir / "progress"
        #: In every process of this world's environment: how its leftovers are found.
        self.token = f"{options.run_id or os.getpid()}/{name}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.launch: Launch | None = None
        self.started_at = 0.0
        self.finished = False
        #: Entries handed back to run in a fresh world (after a fault).
        self.remaining: list[Entry] = []
        #: Results for entries, in the order they completed.
        self.results: list[tuple[Entry, Result]] = []
        #: True when the world never started a cell (the caller may retry it).
        self.start_failed = False
        self.start_error = ""
        self._reported: set[int] = set()
        self._starts: dict[tuple[int, int], dict[str, Any]] = {}
        self._dones: dict[tuple[int, int], dict[str, Any]] = {}
        self._seen: set[str] = set()
        self._pids: dict[int, int] = {}
        self._dead: dict[int, tuple[float, str]] = {}
        self._first_error_at: dict[int, float] = {}

    # ----------------------------------------------------------------- launch
    def start(self) -> None:
        """Write the world file and launch torchrun; OS errors fail the world's cells."""
        opts = self.options
        try:
            if self.dir.exists():  # never read another launch's progress files
                shutil.rmtree(self.dir)
            self.progress.mkdir(parents=True, exist_ok=True)
            home = self.dir / "home"
            tmp = self.dir / "tmp"
            home.mkdir(exist_ok=True)
            tmp.mkdir(exist_ok=True)
            world = {
                "name": self.name,
                "run_id": opts.run_id,
                "supervisor_pid": os.getpid(),
                "project_roots": list(opts.project_roots),
                "dir": str(self.dir),
                "out_root": str(opts.out_root),
                "backend": self.platform.backend,
                "device": self.platform.device,
                "platform": self.platform.name,
                "pg_timeout_s": max(e.cell.timeout_s for e in self.entries) + 60,
                "pythonpath": list(opts.pythonpath),
                "cells": [
                    {"cell": e.cell.to_dict(), "mutant": e.mutant or None, "out_dir": e.out_dir,
                     "case_file": e.cell.case_file}
                    for e in self.entries
                ],
            }
            world_file = self.dir / "world.json"
            atomic_write_json(world_file, world)
            extra = dict(self.platform.env)
            extra["PYTHONPATH"] = os.pathsep.join(opts.pythonpath)
            # Never the working directory first on sys.path: it could shadow a case module.
            extra["PYTHONSAFEPATH"] = "1"
            extra[WORLD_TOKEN] = self.token
            if self.devices:
                extra["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.devices))
            env = hermetic_env(opts.source_env, home=str(home), tmp=str(tmp), extra=extra)
            argv = (
                opts.python, "-m", "torch.distributed.run",
                "--nnodes=1",
                f"--nproc-per-node={self.world_size}",
                "--master-addr=127.0.0.1",
                f"--master-port={free_port()}",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                "-m", "cpmatrix.remote.world_main", str(world_file),
            )
            self.launch = Launch(
                argv=argv, env=env, cwd=opts.project_root,
                writable=(str(opts.out_root),),
                readonly=tuple(dict.fromkeys((opts.project_root, *opts.pythonpath))),
                name=f"cpmatrix-{os.getpid()}-{self.name}".replace(".", "-"),
                devices=self.devices,
            )
            cmd, cmd_env = opts.runner.command(self.launch)
            atomic_write_json(self.dir / "command.json", {"argv": cmd, "env": cmd_env})
            cmd = [sys.executable, "-c", _TRAMPOLINE, str(os.getpid()), *cmd]
            log = open(self.dir / "torchrun.log", "wb")  # noqa: SIM115
            try:
                self.proc = subprocess.Popen(
                    cmd, env=cmd_env, cwd=opts.project_root, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # one killpg takes torchrun and every rank
                )
            finally:
                log.close()
        except OSError as exc:
            self._fail_all(f"could not start the world: {type(exc).__name__}: {exc}")
            return
        self.started_at = time.monotonic()

    def _fail_all(self, message: str) -> None:
        for i, entry in enumerate(self.entries):
            if i in self._reported:
                continue
            self._reported.add(i)
            self.results.append((entry, Result(
                cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
                message=message, mutant=entry.mutant, attempts=entry.attempt,
                out_dir=entry.out_dir,
                stderr_tails={-1: tail_lines(self.dir / "torchrun.log")},
            )))
        self.finished = True

    # ------------------------------------------------------------------ poll
    def _read_progress(self) -> None:
        try:
            names = os.listdir(self.progress)
        except FileNotFoundError:
            return
        for name in names:
            if name in self._seen or name.startswith("."):
                continue
            stem, _, kind = name.rpartition(".")
            idx_s, _, rank_s = stem.partition(".r")
            try:
                key = (int(idx_s), int(rank_s))
                data = read_json(self.progress / name)
            except (ValueError, OSError):
                continue
            self._seen.add(name)
            if not isinstance(data, dict) or data.get("run", "") != self.options.run_id:
                continue  # another run's file (a shared --out): never this run's evidence
            (self._starts if kind == "start" else self._dones)[key] = data
            if kind == "done" and data.get("status") != "ok":
                self._first_error_at.setdefault(key[0], time.monotonic())
        if len(self._pids) < self.world_size:
            for r in range(self.world_size):
                if r not in self._pids:
                    try:
                        data = read_json(self.dir / f"rank{r}.pid")
                        if data.get("run", "") == self.options.run_id:
                            self._pids[r] = int(data["pid"])
                    except (OSError, ValueError, KeyError, AttributeError):
                        pass

    def poll(self) -> list[tuple[Entry, Result]]:
        """Advance; return results completed since the last call."""
        if self.finished:
            return []
        before = len(self.results)
        self._read_progress()
        self._collect_complete()
        rc = self.proc.poll() if self.proc is not None else None
        now = time.monotonic()
        for r, pid in self._host_pids().items():
            if r not in self._dead and not _pid_alive(pid):
                status = _exit_status(pid)
                self._dead[r] = (now, _describe_status(status) if status is not None else "")
        if len(self._reported) == len(self.entries):
            if rc is None:
                # All cells are in; the ranks are tearing down. Give them a moment.
                if now - self._all_done_at() > 20.0:
                    self._kill()
                    self.finished = True
            else:
                self.sweep()  # a case's children must not outlive their world
                self.finished = True
            return self.results[before:]
        if rc is not None:
            self._on_world_exit()
        elif self._dead and now - min(t for t, _ in self._dead.values()) > 3.0:
            # A rank died and torchrun has not torn the rest down yet: do it ourselves.
            self._kill()
            self._on_world_exit()
        else:
            self._check_timeouts(now)
        return self.results[before:]

    _done_at: float | None = None

    def _all_done_at(self) -> float:
        if self._done_at is None:
            self._done_at = time.monotonic()
        return self._done_at

    def _collect_complete(self) -> None:
        for i, entry in enumerate(self.entries):
            if i in self._reported:
                continue
            outs = [self._dones.get((i, r)) for r in range(self.world_size)]
            if any(o is None for o in outs):
                continue
            self._reported.add(i)
            self.results.append((entry, self._result_from_outcomes(i, entry, outs)))  # type: ignore[arg-type]

    def _result_from_outcomes(
        self, i: int, entry: Entry, outs: list[dict[str, Any]], extra_msg: str = "",
        peer_died: bool = False,
    ) -> Result:
        errors = [o for o in outs if o.get("status") != "ok"]
        evidence = _merge_evidence([o.get("evidence", {}) for o in outs])
        duration = max(float(o.get("duration_s", 0.0)) for o in outs)
        case_s = max(float(o.get("case_s", 0.0)) for o in outs)
        if not errors:
            return Result(cell_id=entry.cell.id, status=Status.PASSED, evidence=evidence,
                          duration_s=duration, case_s=case_s, attempts=entry.attempt,
                          mutant=entry.mutant, out_dir=entry.out_dir)
        primary, collateral = split_errors(errors, peer_died=peer_died)
        failures = tuple(
            RankFailure(rank=int(o["rank"]), message=o.get("message", ""),
                        traceback=o.get("traceback", ""), check=o.get("check", ""))
            for o in primary + collateral
        )
        msg = extra_msg
        if collateral:
            note = (f"rank(s) {', '.join(str(o['rank']) for o in collateral)} failed only "
                    "because a peer left the collective")
            msg = f"{msg}; {note}" if msg else note
        return Result(
            cell_id=entry.cell.id, status=Status.FAILED, kind=FailureKind.ERROR,
            failing_ranks=tuple(sorted(int(o["rank"]) for o in primary)),
            failures=failures, stderr_tails=self._tails(i), evidence=evidence,
            duration_s=duration, case_s=case_s, attempts=entry.attempt, message=msg,
            mutant=entry.mutant, out_dir=entry.out_dir,
        )

    def _tails(self, i: int) -> dict[int, str]:
        tails = {}
        for r in range(self.world_size):
            start = self._starts.get((i, r), {}).get("log_offset", 0)
            end = self._dones.get((i, r), {}).get("log_end")
            tails[r] = tail_lines(self.dir / f"rank{r}.log", int(start), end)
        return tails

    def _in_flight(self) -> int | None:
        """The earliest cell some rank started and not every rank finished."""
        started = {i for (i, _r) in self._starts}
        pending = sorted(i for i in started if i not in self._reported)
        return pending[0] if pending else None

    def _check_timeouts(self, now: float) -> None:
        i = self._in_flight()
        if i is None:
            if not self._starts and now - self.started_at > self.options.startup_timeout_s:
                self._kill()
                self._on_world_exit(reason="the world did not start within "
                                    f"{self.options.startup_timeout_s:.0f} s")
            return
        entry = self.entries[i]
        first_start = min(
            float(s["time"]) for (j, _r), s in self._starts.items() if j == i
        )
        elapsed = time.time() - first_start
        if elapsed > entry.cell.timeout_s:
            self._abort(i, FailureKind.TIMEOUT, f"cell ran past its timeout of "
                        f"{entry.cell.timeout_s} s")
            return
        err_at = self._first_error_at.get(i)
        if err_at is not None and now - err_at > self.options.abort_grace_s:
            errors = [o for (j, _r), o in self._dones.items()
                      if j == i and o.get("status") != "ok"]
            shares = getattr(self.options.runner, "shares_pid_namespace", False)
            if all(_COLLATERAL.search(o.get("message", "")) for o in errors) and (
                    self._dead or not shares):
                # The only failures say "a peer went away" and a rank died (or, where
                # rank pids cannot be watched, may have): a crash, whichever of torchrun
                # or this grace period notices first. With every rank alive, such a
                # message is the rank's own error (the abort below attributes it).
                self._dump_stacks()
                self._kill()
                self._on_world_exit()
            else:
                self._abort(i, FailureKind.ERROR, "")

    # ---------------------------------------------------------------- faults
    def _host_pids(self) -> dict[int, int]:
        """Rank pids, only when they are pids in *our* namespace.

        In a container or a pid-unshared sandbox the workers' pids mean other processes
        here: never signal them (we would kill strangers).
        """
        if getattr(self.options.runner, "shares_pid_namespace", False):
            return self._pids
        return {}

    def _dump_stacks(self) -> None:
        (self.dir / "dump.request").write_text(f"{time.time()}\n")
        for pid in self._host_pids().values():
            try:
                os.kill(pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(self.options.dump_wait_s)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # Ranks live in torchrun's process group; kill any that survived by pid too.
        for pid in self._host_pids().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.launch is not None:
            self.options.runner.cleanup(self.launch)
        self.sweep()

    def sweep(self) -> None:
        """Kill every process left of this world: whatever carries its token (ranks in
        their own process group, a case's children and daemons) and torchrun's tree."""
        if self.proc is None:
            return
        root = [self.proc.pid] if self.proc.poll() is None else []
        leftovers = processes_with_token(self.token) + [
            p for r in root for p in descendants(r)]
        if leftovers:
            kill_all(leftovers)

    def _abort(self, i: int, kind: FailureKind, why: str) -> None:
        """Tear the world down because of cell ``i``; hand back the cells after it."""
        entry = self.entries[i]
        self._dump_stacks()
        self._kill()
        self._read_progress()
        self._collect_complete()
        if i in self._reported:
            # Every rank finished the cell while we were dumping stacks: its result is
            # already in. The world is gone all the same; the rest runs in a fresh one.
            self._hand_back()
            return
        outs = {r: self._dones.get((i, r)) for r in range(self.world_size)}
        missing = [r for r, o in outs.items() if o is None]
        stacks = {r: _read_text(self.options.out_root / entry.out_dir / f"rank{r}" / "stacks.txt")
                  for r in range(self.world_size)}
        if kind is FailureKind.ERROR:
            done = [o for o in outs.values() if o is not None]
            result = self._result_from_outcomes(
                i, entry, done,
                extra_msg=f"rank(s) {', '.join(map(str, missing))} did not finish the cell within "
                f"{self.options.abort_grace_s:.0f} s of the failure (waiting on the failed "
                "rank); their stacks are in the cell folder",
            )
        else:
            failures = tuple(
                RankFailure(rank=r, message=f"rank {r} still in the cell after "
                            f"{entry.cell.timeout_s} s", traceback=stacks.get(r, ""))
                for r in missing
            )
            result = Result(
                cell_id=entry.cell.id, status=Status.TIMEOUT, kind=FailureKind.TIMEOUT,
                failing_ranks=tuple(missing), failures=failures, stderr_tails=self._tails(i),
                duration_s=float(entry.cell.timeout_s), attempts=entry.attempt,
                message=why, mutant=entry.mutant, out_dir=entry.out_dir,
            )
        self._reported.add(i)
        self.results.append((entry, result))
        self._hand_back()

    def _hand_back(self) -> None:
        self.remaining = [e for j, e in enumerate(self.entries) if j not in self._reported]
        self._reported.update(range(len(self.entries)))
        self.finished = True

    def _on_world_exit(self, reason: str = "") -> None:
        """torchrun is gone with cells unfinished: a crash, or a world that never started."""
        self.sweep()
        self._read_progress()
        self._collect_complete()
        if len(self._reported) == len(self.entries):
            self.finished = True
            return
        i = self._in_flight()
        log_text = _read_text(self.dir / "torchrun.log")
        if i is None:
            # No cell was in flight: the world failed to start (or died between cells).
            if not self._starts:
                self.start_failed = True
                self.start_error = reason or "torchrun exited before any cell started"
                self._hand_back()
                return
            self._hand_back()
            return
        entry = self.entries[i]
        outs = {r: self._dones.get((i, r)) for r in range(self.world_size)}
        root = _torchrun_root_cause(log_text)
        # A rank that wrote an outcome for the cell was alive after it: not the culprit.
        silent = [r for r, o in outs.items() if o is None]
        dead: list[int] = []
        how: dict[int, str] = {}
        if root is not None and root[0] in silent:
            dead, how = [root[0]], {root[0]: root[1]}
        else:
            seen = {r: v for r, v in self._dead.items() if r in silent}
            if seen:
                first = min(t for t, _ in seen.values())
                dead = sorted(r for r, (t, _) in seen.items() if t - first < 0.05)
                how = {r: seen[r][1] for r in dead}
            else:
                dead = silent
        errors = [o for o in outs.values() if o is not None and o.get("status") != "ok"
                  and not _COLLATERAL.search(o.get("message", ""))]
        if errors:
            # A rank raised and the world then broke: the exception is the cause.
            result = self._result_from_outcomes(
                i, entry, [o for o in outs.values() if o is not None],
                extra_msg="the world died after the failure", peer_died=bool(dead),
            )
        else:
            failures = tuple(
                RankFailure(rank=r, message=f"rank {r} died during the cell"
                            + (f" ({how[r]})" if how.get(r) else ""))
                for r in dead
            ) + tuple(
                RankFailure(rank=int(o["rank"]), message=o.get("message", ""),
                            traceback=o.get("traceback", ""))
                for o in outs.values() if o is not None and o.get("status") != "ok"
            )
            result = Result(
                cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
                failing_ranks=tuple(dead), failures=failures, stderr_tails=self._tails(i),
                attempts=entry.attempt, mutant=entry.mutant, out_dir=entry.out_dir,
                message=reason or "a rank died; the world was torn down",
            )
        self._reported.add(i)
        self.results.append((entry, result))
        self._hand_back()

    def kill(self) -> None:
        """Stop the world now (the run was interrupted)."""
        self._kill()
        self.finished = True


def split_errors(errors: Sequence[Mapping[str, Any]], *, peer_died: bool,
                 ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(primary, collateral) error outcomes of one cell: outcomes first, messages last.

    A rank whose own outcome is an error caused it. Its error is collateral only when
    its message says a peer went away *and* there is such a peer: one that died, or an
    earlier error of another rank whose message is its own. A case that raises
    "Timed out waiting for ..." with every peer alive is that rank's error.

    >>> own = {"rank": 1, "message": "RuntimeError: Timed out waiting for x", "end_time": 2}
    >>> [o["rank"] for o in split_errors([own], peer_died=False)[0]]
    [1]
    >>> cause = {"rank": 0, "message": "ValueError: bad", "end_time": 1}
    >>> [[o["rank"] for o in part] for part in split_errors([own, cause], peer_died=False)]
    [[0], [1]]
    """
    ordered = sorted(errors, key=lambda o: float(o.get("end_time", 0.0)))
    causes = [o for o in ordered if not _COLLATERAL.search(str(o.get("message", "")))]
    primary: list[Mapping[str, Any]] = []
    collateral: list[Mapping[str, Any]] = []
    for o in ordered:
        earlier = any(c is not o and c.get("rank") != o.get("rank")
                      and float(c.get("end_time", 0.0)) <= float(o.get("end_time", 0.0))
                      for c in causes)
        looks = _COLLATERAL.search(str(o.get("message", ""))) is not None
        (collateral if looks and (peer_died or earlier) else primary).append(o)
    if not primary:  # only echoes of a death we cannot place: report them all
        primary, collateral = collateral, []
    return primary, collateral


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _merge_evidence(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One value per key when all ranks agree; else ``key@rankN`` per differing rank."""
    merged: dict[str, Any] = {}
    keys: list[str] = []
    for ev in per_rank:
        for k in ev:
            if k not in keys:
                keys.append(k)
    for k in keys:
        values = [ev.get(k) for ev in per_rank]
        present = [v for v in values if v is not None]
        if all(v == present[0] for v in present) and len(present) == len(values):
            merged[k] = present[0]
        else:
            if values[0] is not None:
                merged[k] = values[0]
            for r, v in enumerate(values):
                if v is not None and (r > 0 and v != values[0]):
                    merged[f"{k}@rank{r}"] = v
    return merged
