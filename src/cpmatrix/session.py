"""A run: plan -> worlds (with restarts and retries) -> results -> merged report.

:func:`run_cells` is what ``cpmatrix run`` calls. It owns the scheduling loop; the
per-world fault handling lives in :mod:`cpmatrix.supervise`.

Guarantees: every planned entry ends as exactly one result; a crashed cell is retried
once alone (passed on retry -> FLAKY); a world that cannot start is retried twice
and then its cells fail with the launcher's error; the report is written atomically.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .fsutil import atomic_write_json, read_json, tail_lines
from .junit import merge_junit, results_to_junit, testcase_name, write_junit
from .plan import DevicePool, plan_batches
from .result import FailureKind, Result, Status
from .spec import Cell, Platform
from .spill_exec import run_spill_cells
from .supervise import Entry, WorldOptions, WorldRun

__all__ = ["RunReport", "load_durations", "run_cells"]

#: How often a world that never starts is launched again before its cells fail.
START_RETRIES = 2


@dataclass
class RunReport:
    """What a run produced; ``results`` maps entry key -> result, in plan order."""

    results: dict[str, Result]
    wall_s: float
    world_starts: int
    report_path: Path
    worlds: int = 0

    def mutant_line(self) -> str:
        """``mutants: K/N killed (kill rate X%)``, naming the survivors."""
        runs = [r for r in self.results.values() if r.mutant]
        killed = [r for r in runs if r.evidence.get("mutant_outcome") == "killed"]
        survivors = [testcase_name(r.cell_id, r.mutant) for r in runs if r not in killed]
        rate = 100.0 * len(killed) / len(runs) if runs else 100.0
        line = f"mutants: {len(killed)}/{len(runs)} killed (kill rate {rate:.1f}%)"
        if survivors:
            line += "\nsurvived (vacuous for these bugs):\n  " + "\n  ".join(survivors)
        return line

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results.values():
            out[r.status.value] = out.get(r.status.value, 0) + 1
        return out


def load_durations(out_root: Path) -> dict[str, float]:
    try:
        data = read_json(out_root / "durations.json")
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


@dataclass
class _Item:
    batch: str
    entries: list[Entry]
    launches: int = 0
    failed_starts: int = 0
    last_error: str = ""


def run_cells(
    cells: Sequence[Cell],
    platforms: Mapping[str, Platform],
    options: WorldOptions,
    *,
    batch_size: int | None = None,
    jobs: int = 1,
    devices: int = 0,
    mutants: Mapping[str, Sequence[str]] | None = None,
    keep_order: bool = False,
    cached: Mapping[str, Result] | None = None,
    store: Callable[[Cell, Result], None] | None = None,
    spill_cache: Path | None = None,
    on_result: Callable[[Entry, Result], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> RunReport:
    """Run ``cells`` (or, with ``mutants``, each cell once per mutant) and write the report."""
    out = options.out_root
    out.mkdir(parents=True, exist_ok=True)
    # A previous run's worlds and cell folders would be read as this run's progress.
    for stale in ("worlds", "cells", "spill"):
        shutil.rmtree(out / stale, ignore_errors=True)
    t0 = time.monotonic()
    durations = load_durations(out)
    cached = cached or {}
    hits = [c for c in cells if c.id in cached and not mutants]
    # Spill cells compile a kernel; they need no world (and have no mutants).
    spill_cells = [c for c in cells if c.kind == "spill" and c.id not in cached]
    batches = plan_batches([c for c in cells if not (c.id in cached and not mutants)
                            and c.kind != "spill"],
                           durations=durations, batch_size=batch_size, mutants=mutants,
                           keep_order=keep_order)
    planned: list[Entry] = []
    queue: deque[_Item] = deque()
    for b in batches:
        entries = [Entry(cell=c, mutant=b.mutant_of(i)) for i, c in enumerate(b.cells)]
        planned.extend(entries)
        queue.append(_Item(batch=b.name, entries=entries))
    if on_start is not None:
        on_start(len(planned) + len(hits) + len(spill_cells))

    results: dict[str, Result] = {}
    first_crash: dict[str, Result] = {}
    by_batch: dict[str, list[str]] = {}
    active: list[tuple[_Item, WorldRun]] = []
    pool = DevicePool(devices)
    world_starts = 0
    cell_index = {c.id: c for c in cells}
    for c in hits:
        entry = Entry(cell=c)
        planned.append(entry)
        results[entry.key] = cached[c.id]
        by_batch.setdefault("cached", []).append(entry.key)
        if on_result is not None:
            on_result(entry, cached[c.id])

    def finish(item: _Item, entry: Entry, result: Result) -> None:
        key = entry.key
        if key in results:
            # Never two results for one cell: the first one stands.
            print(f"cpmatrix: internal: a second result for {key} was dropped "
                  f"({result.status.value})", file=sys.stderr)
            return
        if entry.mutant:
            result = interpret_mutant(result)
        elif entry.attempt > 1 and key in first_crash:
            first = first_crash.pop(key)
            if result.status is Status.PASSED:
                result = replace(
                    first, status=Status.FLAKY, attempts=entry.attempt,
                    evidence=result.evidence, duration_s=result.duration_s,
                    case_s=result.case_s,
                    message=f"passed when retried alone; first attempt: {first.headline()}",
                )
            else:
                result = replace(first, attempts=entry.attempt,
                                 message=f"{first.message}; failed again when retried alone "
                                 f"({result.headline()})".lstrip("; "))
        elif (entry.attempt == 1 and result.kind is FailureKind.CRASH
              and entry.cell.kind != "spill"
              and not result.message.startswith("could not start")):
            # Crashed: retry alone once, to tell FLAKY from FAILED.
            first_crash[key] = result
            queue.append(_Item(batch=f"{item.batch}-retry", entries=[replace(entry, attempt=2)]))
            return
        results[key] = result
        if store is not None and result.status is Status.PASSED and not entry.mutant:
            store(entry.cell, result)
        by_batch.setdefault(item.batch.removesuffix("-retry"), []).append(key)
        if on_result is not None:
            on_result(entry, result)

    if spill_cells:
        spill_item = _Item(batch="spill", entries=[])
        for cell, result in run_spill_cells(spill_cells, out_root=out,
                                            search_path=options.pythonpath,
                                            cache_dir=spill_cache, python=options.python):
            entry = Entry(cell=cell)
            planned.append(entry)
            finish(spill_item, entry, result)

    try:
        while queue or active:
            # Launch what fits (cpu: up to `jobs` worlds; cuda: also disjoint devices).
            while queue and len(active) < max(1, jobs):
                item = queue[0]
                platform = platforms[item.entries[0].cell.platform]
                need = item.entries[0].cell.world_size if platform.device == "cuda" else 0
                devs: tuple[int, ...] = ()
                if need:
                    taken = pool.take(need)
                    if taken is None:
                        if not active:
                            raise RuntimeError(f"a {need}-rank cuda world needs {need} devices; "
                                               f"only {devices} visible")
                        break
                    devs = taken
                queue.popleft()
                item.launches += 1
                name = f"{world_starts:03d}-{item.batch}.a{item.launches}"
                world = WorldRun(name, item.entries, platform, options, devs)
                world.start()
                world_starts += 1
                active.append((item, world))
            time.sleep(0.05)
            still: list[tuple[_Item, WorldRun]] = []
            for item, world in active:
                for entry, result in world.poll():
                    finish(item, entry, result)
                if not world.finished:
                    still.append((item, world))
                    continue
                pool.give(world.devices)
                if world.start_failed:
                    item.failed_starts += 1
                    item.last_error = world.start_error
                    if item.failed_starts > START_RETRIES:
                        _fail_unstarted(item, world, finish)
                        continue
                    queue.appendleft(_Item(batch=item.batch, entries=world.remaining,
                                           launches=item.launches,
                                           failed_starts=item.failed_starts))
                elif world.remaining:
                    # A fault took the world down: the rest runs in a fresh one.
                    queue.appendleft(_Item(batch=item.batch, entries=world.remaining,
                                           launches=item.launches))
            active = still
    finally:
        for _, world in active:
            world.kill()

    # Anything unaccounted for (should not happen) still gets a result: never lose a cell.
    for entry in planned:
        if entry.key not in results:
            results[entry.key] = Result(cell_id=entry.cell.id, status=Status.CRASH,
                                        kind=FailureKind.CRASH, mutant=entry.mutant,
                                        message="cpmatrix lost track of this cell (bug)")
            by_batch.setdefault("lost", []).append(entry.key)

    ordered = {e.key: results[e.key] for e in planned}
    world_files = []
    for batch, keys in by_batch.items():
        path = out / "worlds" / f"{batch}.junit.xml"
        write_junit(path, results_to_junit([ordered[k] for k in keys], cell_index, batch))
        world_files.append(path)
    report = out / "report.xml"
    merge_junit(world_files, report)
    atomic_write_json(out / "results.json", [r.to_dict() for r in ordered.values()])
    new_durations = dict(durations)
    for r in ordered.values():
        if r.status is Status.PASSED and not r.mutant:
            new_durations[r.cell_id] = round(r.duration_s, 4)
    atomic_write_json(out / "durations.json", new_durations)
    return RunReport(
        results=ordered, wall_s=time.monotonic() - t0,
        world_starts=world_starts, report_path=report, worlds=len(batches),
    )


def interpret_mutant(result: Result) -> Result:
    """A mutant run passes when the planted bug made the cell fail (it was killed)."""
    if result.status is Status.PASSED:
        return replace(
            result, status=Status.FAILED, kind=FailureKind.ERROR,
            evidence={**result.evidence, "mutant_outcome": "survived"},
            message=f"mutant {result.mutant!r} survived: the cell passed with this bug "
            "planted, so the test is vacuous for it",
        )
    if result.message.startswith("could not start"):
        return result  # infrastructure, not a kill
    first = result.first_failure
    by = (first.check if first and first.check else "") or (
        first.message.split(":")[0] if first and first.message else "") or (
        result.kind.value if result.kind else "failure")
    return replace(
        result, status=Status.PASSED, kind=None,
        evidence={**result.evidence, "mutant_outcome": "killed", "killed_by": by},
        message=f"mutant {result.mutant!r} killed by {by}: {result.headline()}",
    )


def _fail_unstarted(
    item: _Item, world: WorldRun, finish: Callable[[_Item, Entry, Result], None]
) -> None:
    tail = tail_lines(world.dir / "torchrun.log")
    for entry in world.remaining:
        finish(item, replace(entry, attempt=2), Result(
            cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
            message=f"could not start a world after {item.failed_starts} tries: "
            f"{item.last_error}", stderr_tails={-1: tail}, mutant=entry.mutant,
            out_dir=entry.out_dir,
        ))
