"""A fork launcher started before its world is known, adopted by the first world that fits.

A world's launcher (:mod:`cpmatrix.worker.forkrun`) spends its first seconds importing
torch and the DTensor modules; the world itself is known only once its cells are
planned. The pytest front collects first (seconds more), so it starts a **spare**
launcher as soon as it is configured (``python -m cpmatrix.worker.forkrun --adopt``):
it imports what every world needs, then waits for one line on its standard input, its
world's command. The first world the run starts hands it that line (:meth:`Spare.take`)
instead of starting a launcher of its own: the imports ran while the controller
collected.

A spare is adopted only when nothing that acts at interpreter start differs: the same
interpreter, the fork launcher, the local runner, and the world's environment equal to
the spare's but for ``HOME``, ``TMPDIR`` and the world token (``CPMATRIX_WORLD``):
``HOME``/``TMPDIR`` become the world's before anything of the world runs (each cell gets
its own anyway), and the world takes the spare's token, which every process of the tree
carries from its start (the sweep reads it from ``/proc``). Anything else (another
``PYTHONPATH``, an allow-listed variable changed since, a CUDA world) starts its own
launcher. An unadopted spare is killed when the run ends (:meth:`Spare.close`); it dies
with cpmatrix in any case (the parent-death signal, as every launcher).

Example::

    >>> Spare.differences({"A": "1", "HOME": "/a"}, {"A": "1", "HOME": "/b"})
    []
    >>> Spare.differences({"A": "1"}, {"A": "2", "B": "3"})
    ['A', 'B']
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from cpmatrix.supervise.executors.launch import FORKRUN, TRAMPOLINE
from cpmatrix.supervise.runners.base import Launch, Runner, hermetic_env
from cpmatrix.supervise.runners.local import LocalRunner
from cpmatrix.worker.procs import WORLD_TOKEN, kill_all, processes_with_token

__all__ = ["Spare", "world_env"]

#: What may differ between the spare's environment and its world's.
_OWN = frozenset({"HOME", "TMPDIR", WORLD_TOKEN})


def world_env(source: Mapping[str, str], platform_env: Iterable[tuple[str, str]],
              pythonpath: tuple[str, ...], *, home: str, tmp: str, token: str,
              cuda_visible: str | None = None) -> dict[str, str]:
    """A world launcher's whole environment (the world executor's and a spare's);
    ``platform_env``: the platform's ``env`` pairs."""
    extra = dict(platform_env)
    extra["PYTHONPATH"] = os.pathsep.join(pythonpath)
    # Never the working directory first on sys.path: it could shadow a case module.
    extra["PYTHONSAFEPATH"] = "1"
    extra[WORLD_TOKEN] = token
    if cuda_visible is not None:
        extra["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return hermetic_env(source, home=home, tmp=tmp, extra=extra)


class Spare:
    """One waiting fork launcher, started now (:meth:`start`), for the first world that
    fits (:meth:`take`)."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: Path, python: str,
                 env: dict[str, str]) -> None:
        self.proc = proc
        self.folder = folder
        self.python = python
        self.env = env
        self.token = env[WORLD_TOKEN]
        self.taken = False
        #: Why the last world did not take it ("" once taken): evidence for tests and logs.
        self.why_not = ""

    @classmethod
    def start(cls, python: str, source: Mapping[str, str],
              platform_env: Iterable[tuple[str, str]],
              pythonpath: tuple[str, ...]) -> Spare:
        """Start a spare launcher with the environment a world of this run would get."""
        folder = Path(tempfile.mkdtemp(prefix="cpmatrix-spare-"))
        (folder / "home").mkdir()
        (folder / "tmp").mkdir()
        env = world_env(source, platform_env, pythonpath, home=str(folder / "home"),
                        tmp=str(folder / "tmp"), token=f"spare/{secrets.token_hex(6)}")
        with open(folder / "spare.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", TRAMPOLINE, str(os.getpid()), python, "-m", FORKRUN,
                 "--adopt"], env=env, cwd=folder, stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        return cls(proc, folder, python, env)

    @staticmethod
    def differences(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
        """The variables, besides :data:`_OWN`, whose values differ."""
        keys = (set(mine) | set(theirs)) - _OWN
        return sorted(k for k in keys if mine.get(k) != theirs.get(k))

    def take(self, launch: Launch, runner: Runner, log: Path) -> subprocess.Popen[bytes] | None:
        """Hand ``launch`` to the spare if it fits (see the module); its process, or None
        (``why_not`` says why) and the world starts its own launcher."""
        self.why_not = self._unfit(launch, runner)
        if self.why_not:
            return None
        env = {**launch.env, WORLD_TOKEN: self.token}
        line = json.dumps({"argv": list(launch.argv[3:]), "env": env, "cwd": launch.cwd,
                           "log": str(log)}) + "\n"
        assert self.proc.stdin is not None
        try:
            log.touch()
            self.proc.stdin.write(line.encode())
            self.proc.stdin.close()
        except OSError as exc:  # it died since: start a launcher as usual
            self.why_not = f"the spare launcher is gone ({exc})"
            return None
        self.taken = True
        return self.proc

    def _unfit(self, launch: Launch, runner: Runner) -> str:
        if self.taken:
            return "taken by an earlier world"
        if self.proc.poll() is not None:
            return f"the spare launcher exited ({self.proc.returncode})"
        if runner.name != LocalRunner.name:
            return f"the {runner.name} runner"
        if tuple(launch.argv[:3]) != (self.python, "-m", FORKRUN):
            return "not the fork launcher of this interpreter"
        diff = self.differences(self.env, launch.env)
        return f"the environment differs in {', '.join(diff)}" if diff else ""

    def close(self) -> None:
        """At the end of the run: kill what is left of the spare (untaken, or of the
        world that took it: that world has ended), every process carrying its token, and
        remove its folder (its ``HOME`` and ``TMPDIR`` before adoption)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        kill_all(processes_with_token(self.token))
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        shutil.rmtree(self.folder, ignore_errors=True)
