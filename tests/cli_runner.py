"""Run the real ``cpmatrix`` CLI in a subprocess, as a user would (shared by the tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RES = Path(__file__).parent / "resources"


def run_cli(*args: str, timeout: float = 600, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m cpmatrix ARGS`` (``env`` added to this environment); output as text."""
    return subprocess.run(
        [sys.executable, "-m", "cpmatrix", *args], capture_output=True, text=True,
        timeout=timeout, check=False, cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )


#: Runs :func:`start_cli` started and nobody reaped yet: ``tests/conftest.py`` ends them
#: after each test, so a test that fails before its ``wait`` leaves no run behind (a
#: leftover would hold cores and fail a later test with a ResourceWarning).
STARTED: list[subprocess.Popen[bytes]] = []


def start_cli(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """``python -m cpmatrix ARGS`` in the background, output to ``log``."""
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "cpmatrix", *args],
                                stdout=f, stderr=subprocess.STDOUT)
    STARTED.append(proc)
    return proc


def reap_started(grace: float = 30.0) -> list[int]:
    """End every run :func:`start_cli` started that is still going (SIGTERM, then SIGKILL
    after ``grace``; cpmatrix ends its worlds on SIGTERM) and reap all; the pids it had
    to end."""
    ended = []
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            ended.append(proc.pid)
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()
    return ended


def wait_for(what: str, ready: Callable[[], bool], timeout: float = 120.0) -> None:
    """Poll ``ready`` every 0.1 s; fail the test naming ``what`` after ``timeout``."""
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGINT, timeout: float = 60) -> int:
    """Send ``sig`` and wait for the exit code (killing it if it does not exit)."""
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"cpmatrix did not exit within {timeout} s of signal {sig}") from None


def results_by_target(out: Path) -> dict[str, dict[str, Any]]:
    """``results.json`` of a run, keyed by target name."""
    results = json.loads((out / "results.json").read_text())
    return {r["cell_id"].split("[", 1)[0]: r for r in results}


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def processes_with(marker: str) -> list[tuple[int, str]]:
    """Live processes whose command line or environment contains ``marker``."""
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().decode(errors="replace")
            except OSError:
                env = ""
        except OSError:
            continue
        if (marker in cmd or marker in env) and pid_alive(pid):
            found.append((pid, cmd))
    return found
