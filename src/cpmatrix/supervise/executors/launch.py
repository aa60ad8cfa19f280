"""Starting, watching and ending a child process tree; reading its typed progress files.

Shared by every executor: a :class:`Child` is started through the run's runner, behind a
trampoline that sets the parent-death signal (it dies with cpmatrix, even on SIGKILL), in
its own session, with the world's token in its environment (so its leftovers are found
and killed when it ends, wherever they are in the tree). :class:`Progress` reads the
start markers and outcomes of :mod:`cpmatrix.worker.protocol`, this run's only.

Example::

    >>> 1024 <= free_port() < 65536
    True
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from cpmatrix.module_names import FORKRUN, WORLD_MAIN
from cpmatrix.supervise.runners.base import Launch, Runner
from cpmatrix.worker.procs import (
    WORLD_TOKEN,
    descendants,
    kill_all,
    processes_with_token,
    stat_fields,
)
from cpmatrix.worker.protocol import (
    START,
    Outcome,
    StartMarker,
    parse_marker_name,
    read_typed,
)


class Adoptable(Protocol):
    """A launcher already running that may take a launch (a spare, see
    :mod:`cpmatrix.supervise.executors.spare`)."""

    token: str

    def take(self, launch: Launch, runner: Runner, log: Path
             ) -> subprocess.Popen[bytes] | None: ...

__all__ = ["FORKRUN", "TRAMPOLINE", "WORLD_TOKEN", "Child", "Progress", "free_port",
           "launcher_argv", "physical_devices", "pid_state"]

#: Starts the command with the parent-death signal set: if cpmatrix dies, even by SIGKILL,
#: the kernel kills the child (and each rank then dies with the launcher). argv: the expected
#: parent pid, then the command.
TRAMPOLINE = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launcher_argv(launcher: str, python: str, ranks: int, port: int,
                  world_file: str, root_cause_file: str = "", run_id: str = "",
                  ) -> tuple[str, ...]:
    """The command that starts a world's ranks, each running ``world_main``.

    ``fork``: :mod:`cpmatrix.worker.forkrun` imports torch once and forks the ranks
    (a 4-rank world starts several times faster on CPU; docs/worlds.md has the numbers);
    it writes the first failing rank to ``root_cause_file`` (``WorldFolder.root_cause``),
    as run ``run_id``'s.
    ``torchrun``: ``torch.distributed.run``, each rank a fresh interpreter.

    >>> launcher_argv("fork", "py", 2, 9, "w.json")[:3]
    ('py', '-m', 'cpmatrix.worker.forkrun')
    """
    common = (f"--nproc-per-node={ranks}", "--master-addr=127.0.0.1", f"--master-port={port}")
    if launcher == "fork":
        record = (f"--root-cause-file={root_cause_file}",
                  f"--run-id={run_id}") if root_cause_file else ()
        return (python, "-m", FORKRUN, *common, *record,
                "-m", WORLD_MAIN, world_file)
    return (python, "-m", "torch.distributed.run", "--nnodes=1", *common,
            "--max-restarts=0", "--monitor-interval=0.1",
            "-m", WORLD_MAIN, world_file)


class Child:
    """One launched process tree (a launcher and its ranks, or a compile subprocess)."""

    def __init__(self, token: str, runner: Runner) -> None:
        #: ``<run>/<job>``: in every process's environment (``CPMATRIX_WORLD``).
        self.token = token
        self.runner = runner
        self.proc: subprocess.Popen[bytes] | None = None
        self.launch: Launch | None = None
        #: Whether a spare launcher took the launch (:meth:`start`).
        self.adopted = False

    def start(self, launch: Launch, log: Path, spare: Adoptable | None = None) -> list[str]:
        """Launch through the runner; returns the argv (OSError when it cannot start).
        ``spare``: a waiting launcher to hand the launch to if it fits (it then carries
        the spare's token: :mod:`cpmatrix.supervise.executors.spare`)."""
        self.launch = launch
        cmd, cmd_env = self.runner.command(launch)
        adopted = spare.take(launch, self.runner, log) if spare is not None else None
        if adopted is not None and spare is not None:
            self.proc, self.token, self.adopted = adopted, spare.token, True
            return cmd
        argv = [sys.executable, "-c", TRAMPOLINE, str(os.getpid()), *cmd]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, env=cmd_env, cwd=launch.cwd, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        return cmd

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def kill(self, extra_pids: Sequence[int] = ()) -> None:
        """SIGKILL the tree (its process group, ``extra_pids``, everything with the token),
        wait for it, and let the runner clean up (a container)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in extra_pids:
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
            self.runner.cleanup(self.launch)
        self.sweep()

    def sweep(self) -> None:
        """Kill what is left of the tree: whatever carries the token (ranks in their own
        process group, a case's children and daemons) and the launcher's descendants."""
        if self.proc is None:
            return
        root = [self.proc.pid] if self.proc.poll() is None else []
        leftovers = processes_with_token(self.token) + [p for r in root for p in descendants(r)]
        if leftovers:
            kill_all(leftovers)


class Progress:
    """The start markers and outcomes in one ``progress/`` folder, this run's only."""

    def __init__(self, folder: Path, run_id: str) -> None:
        self.folder = folder
        self.run_id = run_id
        self.starts: dict[tuple[int, int], StartMarker] = {}
        self.dones: dict[tuple[int, int], Outcome] = {}
        self._seen: set[str] = set()

    def read(self) -> list[Outcome]:
        """Read new markers; return the outcomes that arrived since the last call."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        new: list[Outcome] = []
        for name in names:
            parsed = parse_marker_name(name)
            if name in self._seen or parsed is None:
                continue
            index, rank, kind = parsed
            marker = read_typed(self.folder / name, StartMarker if kind == START else Outcome,
                                run=self.run_id)
            # Markers are written atomically: a file that is there is whole. One that does
            # not read as this run's (another run's, on a shared --out) is never evidence.
            if marker is None:
                self._seen.add(name)
                continue
            if isinstance(marker, Outcome):
                if marker.final:
                    self._seen.add(name)  # else read again: the final one replaces it
                previous = self.dones.get((index, rank))
                self.dones[(index, rank)] = marker
                if previous is None or previous.final != marker.final:
                    new.append(marker)
            else:
                self._seen.add(name)
                self.starts[(index, rank)] = marker  # type: ignore[assignment]
        return new

    def final(self, index: int, rank: int) -> bool:
        """The rank's outcome of cell ``index`` is in, and final (its groups checked)."""
        done = self.dones.get((index, rank))
        return done is not None and done.final


def pid_state(pid: int) -> tuple[bool, int | None]:
    """(alive, raw wait status from /proc field 52 once it is a zombie)."""
    fields = stat_fields(pid)
    if not fields:
        return False, None
    if fields[0] not in ("Z", "X"):
        return True, None
    try:
        return False, int(fields[49]) if len(fields) > 49 else None
    except ValueError:
        return False, None


def physical_devices(pool: tuple[int, ...], env: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for pool indices, through the caller's own list.

    The pool counts the devices this process sees: with ``CUDA_VISIBLE_DEVICES=2,3`` set
    by the caller, pool device 0 is physical GPU 2, not GPU 0.

    >>> physical_devices((0, 1), {"CUDA_VISIBLE_DEVICES": "2,3"}), physical_devices((1,), {})
    ('2,3', '1')
    """
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return ",".join(visible[i] if i < len(visible) else str(i) for i in pool)
