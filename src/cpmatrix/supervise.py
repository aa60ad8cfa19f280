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
"""

from __future__ import annotations

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

from .fsutil import atomic_write_json, read_json, tail_lines
from .junit import testcase_name
from .result import FailureKind, RankFailure, Result, Status
from .runners.base import Launch, Runner, hermetic_env
from .spec import Cell, Platform

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
        base = f"cells/{self.cell.id}"
        return f"{base}/mutant-{self.mutant}" if self.mutant else base


@dataclass(frozen=True, kw_only=True)
class WorldOptions:
    out_root: Path
    runner: Runner
    python: str = sys.executable
    pythonpath: tuple[str, ...] = ()
    project_root: str = "."
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
                "dir": str(self.dir),
                "out_root": str(opts.out_root),
                "backend": self.platform.backend,
                "device": self.platform.device,
                "platform": self.platform.name,
                "pg_timeout_s": max(e.cell.timeout_s for e in self.entries) + 60,
                "pythonpath": list(opts.pythonpath),
                "cells": [
                    {"cell": e.cell.to_dict(), "mutant": e.mutant or None, "out_dir": e.out_dir}
                    for e in self.entries
                ],
            }
            world_file = self.dir / "world.json"
            atomic_write_json(world_file, world)
            extra = dict(self.platform.env)
            extra["PYTHONPATH"] = os.pathsep.join(opts.pythonpath)
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
                "-m", "cpmatrix.worker", str(world_file),
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
            (self._starts if kind == "start" else self._dones)[key] = data
            if kind == "done" and data.get("status") != "ok":
                self._first_error_at.setdefault(key[0], time.monotonic())
        if len(self._pids) < self.world_size:
            for r in range(self.world_size):
                if r not in self._pids:
                    try:
                        self._pids[r] = int(read_json(self.dir / f"rank{r}.pid")["pid"])
                    except (OSError, ValueError, KeyError):
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
        self, i: int, entry: Entry, outs: list[dict[str, Any]], extra_msg: str = ""
    ) -> Result:
        errors = [o for o in outs if o.get("status") != "ok"]
        evidence = _merge_evidence([o.get("evidence", {}) for o in outs])
        duration = max(float(o.get("duration_s", 0.0)) for o in outs)
        case_s = max(float(o.get("case_s", 0.0)) for o in outs)
        if not errors:
            return Result(cell_id=entry.cell.id, status=Status.PASSED, evidence=evidence,
                          duration_s=duration, case_s=case_s, attempts=entry.attempt,
                          mutant=entry.mutant, out_dir=entry.out_dir)
        primary = [o for o in errors if not _COLLATERAL.search(o.get("message", ""))] or errors
        collateral = [o for o in errors if o not in primary]
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
            if all(_COLLATERAL.search(o.get("message", "")) for o in errors):
                # The only failures say "a peer went away": a rank died. That is a crash,
                # whichever of torchrun or this grace period notices first.
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
                extra_msg="the world died after the failure",
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
