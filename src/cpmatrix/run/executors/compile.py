"""Runs a run's spill cells (``kind: spill``) in a compile subprocess, with a watchdog.

Spill cells need no torchrun world: each compiles one Triton kernel for one arch and
reads ``ptxas -v``. They run in one subprocess (:mod:`cpmatrix.remote.compile_main`), without
``TRITON_INTERPRET``; a cell past its timeout or a crashed compiler fails that cell
only, and the rest continue in a fresh subprocess.

Example::

    >>> results = run_spill_cells(cells, out_root=Path("out"), search_path=(),
    ...                           cache_dir=None)                       # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cpmatrix.fsutil import atomic_write_json, read_json, tail_lines
from cpmatrix.matrix.schema import Cell
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.run.runners.base import hermetic_env

__all__ = ["run_spill_cells"]

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


def _result(cell: Cell, done: dict[str, Any]) -> Result:
    evidence = _evidence(done.get("evidence", {}))
    if done.get("status") == "ok":
        return Result(cell_id=cell.id, status=Status.PASSED, evidence=evidence,
                      duration_s=float(done.get("duration_s", 0.0)),
                      case_s=float(done.get("duration_s", 0.0)), message=done.get("message", ""),
                      )
    message = str(done.get("message", "spill gate failed"))
    return Result(
        cell_id=cell.id, status=Status.FAILED, kind=FailureKind.ERROR, failing_ranks=(0,),
        failures=(RankFailure(rank=0, message=message, traceback=done.get("traceback", ""),
                              check="spill"),),
        evidence=evidence, duration_s=float(done.get("duration_s", 0.0)), message=message,
    )


def _attempt(cells: Sequence[Cell], job_dir: Path, search_path: Sequence[str],
             cache_dir: Path | None, python: str) -> Iterator[tuple[Cell, Result]]:
    """One compile subprocess over ``cells``; yields results; stops at the first fault."""
    if job_dir.exists():
        shutil.rmtree(job_dir)
    progress = job_dir / "progress"
    progress.mkdir(parents=True)
    job = {"cells": [{"id": c.id, "spill": read_spill(c)} for c in cells],
           "progress": str(progress), "cache_dir": str(cache_dir) if cache_dir else None,
           "search_path": list(search_path)}
    atomic_write_json(job_dir / "job.json", job)
    env = hermetic_env(os.environ, home=str(job_dir), tmp=str(job_dir),
                       extra={"PYTHONPATH": os.pathsep.join(search_path)})
    env.pop("TRITON_INTERPRET", None)  # the compiler must see the real backend
    log = open(job_dir / "spill.log", "wb")  # noqa: SIM115
    try:
        proc = subprocess.Popen([python, "-m", "cpmatrix.remote.compile_main",
                                 str(job_dir / "job.json")],
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        log.close()
        for c in cells:
            yield c, Result(cell_id=c.id, status=Status.CRASH, kind=FailureKind.CRASH,
                            message=f"could not start the spill compiler: {exc}")
        return
    log.close()
    i = 0
    started: float | None = None
    try:
        while i < len(cells):
            done_path = progress / f"{i}.done"
            if done_path.exists():
                yield cells[i], _result(cells[i], read_json(done_path))
                i += 1
                started = None
                continue
            if started is None and (progress / f"{i}.start").exists():
                started = time.monotonic()
            if started is not None and time.monotonic() - started > cells[i].timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                yield cells[i], Result(
                    cell_id=cells[i].id, status=Status.TIMEOUT, kind=FailureKind.TIMEOUT,
                    failing_ranks=(0,), message=f"compile ran past {cells[i].timeout_s} s")
                return
            if proc.poll() is not None and not done_path.exists():
                tail = tail_lines(job_dir / "spill.log", lines=20)
                yield cells[i], Result(
                    cell_id=cells[i].id, status=Status.CRASH, kind=FailureKind.CRASH,
                    failing_ranks=(0,), stderr_tails={0: tail},
                    message=f"the spill compiler died (exit {proc.returncode})")
                return
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def read_spill(cell: Cell) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(cell.spill)
    return value


def run_spill_cells(
    cells: Sequence[Cell], *, out_root: Path, search_path: Sequence[str],
    cache_dir: Path | None, python: str = sys.executable,
) -> list[tuple[Cell, Result]]:
    """Gate every spill cell; one result per cell, in order, whatever happens."""
    results: list[tuple[Cell, Result]] = []
    remaining = list(cells)
    attempt = 0
    while remaining:
        attempt += 1
        got = 0
        for cell, result in _attempt(remaining, out_root / "spill" / f"a{attempt}",
                                     search_path, cache_dir, python):
            results.append((cell, result))
            got += 1
        remaining = remaining[got:]
    return results
