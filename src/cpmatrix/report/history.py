"""A cell's recorded runs: ``durations.json``, the planner's durations and a flake history.

Per cell id, the last passing run's seconds (what runs and shards are planned by) and
its last :data:`KEEP` runs: when each ended, its outcome and its seconds. A cell whose
kept runs both passed and failed has *flipped*: ``cpmatrix show CELL --history`` prints
it, the HTML report marks it. ``cpmatrix run`` adds every run it made (each of
``--runs-per-test N``; never a cached pass, a mutant run or a run without a verdict),
``cpmatrix merge`` unites the shards' histories.

The file (version 2)::

    {"t[unit,1x1,fp64,autocast=off,reference]@cpu":
        {"duration_s": 0.21,
         "runs": [{"at": 1764640000.0, "outcome": "passed", "duration_s": 0.21}]}}

The form before it, ``{"<cell id>": 0.21}``, is still read (a history of no runs).

Example::

    >>> h = with_runs({}, [Result(cell_id="c", status=Status.PASSED, duration_s=1.0),
    ...                    Result(cell_id="c", status=Status.FAILED, duration_s=2.0)], at=5.0)
    >>> h["c"].duration_s, h["c"].passed, h["c"].failed, h["c"].flipped
    (1.0, 1, 1, True)
    >>> parse_histories({"c": 3.0}, "old.json")["c"]
    CellHistory(duration_s=3.0, runs=())
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cpmatrix.fsutil import atomic_write_json
from cpmatrix.layout import RunLayout
from cpmatrix.result import Result, Status

__all__ = ["KEEP", "CellHistory", "RunRecord", "durations_of", "history_json", "load_histories",
           "load_run_history", "merge_histories", "parse_histories", "read_histories",
           "save_run_history", "with_runs"]

#: Runs kept per cell (the oldest go first).
KEEP: Final = 20
#: The statuses a run is recorded with: it ran and has a verdict of its own. FLAKY here
#: is one run that crashed and passed when retried alone: not a pass.
RECORDED: Final = (Status.PASSED, Status.FAILED, Status.CRASH, Status.TIMEOUT, Status.FLAKY)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run of a cell: when it ended (Unix time), its outcome (a status value)."""

    at: float
    outcome: str
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.outcome == Status.PASSED.value


@dataclass(frozen=True, slots=True)
class CellHistory:
    """A cell's last passing duration (None: never passed here) and its kept runs, oldest
    first."""

    duration_s: float | None = None
    runs: tuple[RunRecord, ...] = ()

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.runs)

    @property
    def failed(self) -> int:
        return len(self.runs) - self.passed

    @property
    def flipped(self) -> bool:
        """Both passed and failed within the kept runs: flaky, or fixed/broken lately."""
        return self.passed > 0 and self.failed > 0

    @property
    def flake_rate(self) -> float:
        """Share of the kept runs that did not pass, where the history flipped (a cell that
        always fails is broken, not flaky: 0.0)."""
        return self.failed / len(self.runs) if self.flipped else 0.0

    def flip_summary(self) -> str:
        """One line on a flipped history ("" when it did not flip).

        >>> CellHistory(runs=(RunRecord(1.0, "passed", 1.0), RunRecord(2.0, "failed", 1.0))
        ...             ).flip_summary()
        'flipped in its history: 1 passed, 1 failed of the last 2 runs (flake rate 50%)'
        """
        if not self.flipped:
            return ""
        return (f"flipped in its history: {self.passed} passed, {self.failed} failed of the "
                f"last {len(self.runs)} runs (flake rate {100 * self.flake_rate:.0f}%)")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a number of seconds, got {value!r}")
    return float(value)


def parse_histories(data: Any, where: str) -> dict[str, CellHistory]:
    """The histories in a parsed ``durations.json`` (either form); ``ValueError`` naming
    the file, the cell and what is wrong for anything else."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of cell id to history, got "
                         f"{type(data).__name__}")
    out: dict[str, CellHistory] = {}
    for cell, value in data.items():
        at = f"{where}: {cell}"
        if not isinstance(value, dict):  # the form before histories: seconds only
            out[str(cell)] = CellHistory(duration_s=_number(value, at))
            continue
        unknown = set(value) - {"duration_s", "runs"}
        if unknown:
            raise ValueError(f"{at}: unknown keys {sorted(unknown)} (allowed: duration_s, runs)")
        duration = value.get("duration_s")
        runs = value.get("runs", [])
        if not isinstance(runs, list):
            raise ValueError(f"{at}: runs must be a list, got {type(runs).__name__}")
        records = []
        for i, run in enumerate(runs):
            if not isinstance(run, dict) or not isinstance(run.get("outcome"), str):
                raise ValueError(f"{at}: runs[{i}] must be a mapping with at, outcome, "
                                 f"duration_s; got {run!r}")
            records.append(RunRecord(at=_number(run.get("at"), f"{at}: runs[{i}].at"),
                                     outcome=run["outcome"],
                                     duration_s=_number(run.get("duration_s"),
                                                        f"{at}: runs[{i}].duration_s")))
        out[str(cell)] = CellHistory(
            duration_s=None if duration is None else _number(duration, f"{at}: duration_s"),
            runs=tuple(records[-KEEP:]))
    return out


def read_histories(path: str | os.PathLike[str]) -> dict[str, CellHistory]:
    """A ``durations.json``; ``OSError`` or ``ValueError`` (naming it) when unreadable."""
    where = os.fspath(path)
    with open(where, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
    return parse_histories(data, where)


def load_histories(path: str | os.PathLike[str]) -> dict[str, CellHistory]:
    """Like :func:`read_histories`, but an absent or unreadable file is no history (a
    planner's hint must never fail a run)."""
    try:
        return read_histories(path)
    except (OSError, ValueError):
        return {}


def load_run_history(out: Path) -> dict[str, CellHistory]:
    """The history an output folder ``out`` holds (a run's or a merge's): the one reader of
    a folder's ``durations.json``; none when absent or unreadable (:func:`load_histories`).

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> save_run_history(out, {"c": CellHistory(duration_s=2.0)})
    >>> load_run_history(out)["c"].duration_s, load_run_history(out / "nowhere")
    (2.0, {})
    """
    return load_histories(RunLayout(out).durations)


def save_run_history(out: Path, histories: Mapping[str, CellHistory]) -> None:
    """Write ``histories`` as output folder ``out``'s ``durations.json`` (atomically): the
    one writer, for a run and a merge alike."""
    atomic_write_json(RunLayout(out).durations, history_json(histories))


def durations_of(histories: Mapping[str, CellHistory]) -> dict[str, float]:
    """Cell id -> seconds of its last passing run, for the planner."""
    return {c: h.duration_s for c, h in histories.items() if h.duration_s is not None}


def with_runs(histories: Mapping[str, CellHistory], results: Iterable[Result], *,
              at: float) -> dict[str, CellHistory]:
    """``histories`` with each run of ``results`` added (those with a verdict, not mutant
    runs), in order, at time ``at``; a passing run's seconds become the cell's duration."""
    out = dict(histories)
    for r in results:
        if r.mutant or r.status not in RECORDED:
            continue
        old = out.get(r.cell_id, CellHistory())
        seconds = round(r.duration_s, 4)
        out[r.cell_id] = CellHistory(
            duration_s=seconds if r.status is Status.PASSED else old.duration_s,
            runs=(*old.runs, RunRecord(at=round(at, 3), outcome=r.status.value,
                                       duration_s=seconds))[-KEEP:])
    return out


def merge_histories(histories: Iterable[Mapping[str, CellHistory]]) -> dict[str, CellHistory]:
    """One history of several (shards of one run, or a run and an older baseline): each
    cell's runs united (a run two files share counts once), oldest first, the last
    :data:`KEEP` kept; its duration the last file's that has one."""
    out: dict[str, CellHistory] = {}
    for h in histories:
        for cell, mine in h.items():
            old = out.get(cell)
            if old is None:
                out[cell] = mine
                continue
            out[cell] = CellHistory(
                duration_s=mine.duration_s if mine.duration_s is not None else old.duration_s,
                runs=_union(old.runs, mine.runs)[-KEEP:])
    return out


def _union(old: tuple[RunRecord, ...], mine: tuple[RunRecord, ...]) -> tuple[RunRecord, ...]:
    """A multiset union in time order: what both hold (shards of one baseline) counts
    once, the alike runs of one run (same time, outcome, seconds) all. The runs of one
    ``--runs-per-test`` run share their time, so the sort is stable and each file's own
    order stands: alike runs are never pulled together past the runs between them."""
    have = Counter(old)
    seen: Counter[RunRecord] = Counter()
    extra = []
    for r in mine:
        seen[r] += 1
        if seen[r] > have[r]:
            extra.append(r)
    return tuple(sorted((*old, *extra), key=lambda r: r.at))


def history_json(histories: Mapping[str, CellHistory]) -> dict[str, Any]:
    """The file's form of ``histories`` (cells sorted)."""
    return {cell: {"duration_s": h.duration_s,
                   "runs": [{"at": r.at, "outcome": r.outcome, "duration_s": r.duration_s}
                            for r in h.runs]}
            for cell, h in sorted(histories.items())}
