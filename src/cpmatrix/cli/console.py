"""Human output: a progress bar on a terminal, plain lines otherwise; the summary; the
:class:`Console` that shows a run's pipeline (its :class:`~cpmatrix.supervise.pipeline.Hooks`).

The summary lists failures first, one block each (:mod:`cpmatrix.cli.failures`: the
ranks with one traceback grouped, your frames, the evidence by rank, the repro line),
then a table per target (cells, passed, failed, time), the slowest cells
(``--durations N``), the counts and the wall time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from cpmatrix.cli.failures import failure_block
from cpmatrix.layout import REPORT_HTML, REPORT_XML
from cpmatrix.result import Result, Status, target_of, testcase_name
from cpmatrix.supervise.pipeline import Entry, RunReport

__all__ = ["Console", "Progress", "format_summary", "target_table"]


class Progress:
    """Cells done / failed / total with an ETA; rich on a TTY, a line per cell otherwise."""

    def __init__(self, stream: TextIO | None = None, *, force_plain: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.total = 0
        self.done = 0
        self.failed = 0
        self._rich: Any = None
        self._task: Any = None
        self.plain = force_plain or not self.stream.isatty()

    def start(self, total: int) -> None:
        self.total = total
        if self.plain:
            print(f"running {total} cells", file=self.stream, flush=True)
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self._rich = RichProgress(
            TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(),
            console=Console(file=self.stream), transient=False,
        )
        self._rich.start()
        self._task = self._rich.add_task("cells", total=total, failed=0)

    def update(self, entry: Entry, result: Result) -> None:
        self.done += 1
        if not result.status.ok:
            self.failed += 1
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, failed=self.failed)
            if not result.status.ok:
                self._rich.console.print(f"[red]{result.status.label}[/] {entry.key}")
            return
        width = len(str(self.total))
        label = result.status.label
        print(f"[{self.done:>{width}}/{self.total}] {label:<7} {entry.key} "
              f"({result.duration_s:.2f}s)", file=self.stream, flush=True)

    def note(self, line: str) -> None:
        """A line above the bar (or a plain line)."""
        if self._rich is not None:
            self._rich.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def stop(self) -> None:
        if self._rich is not None:
            self._rich.stop()


def format_summary(report: RunReport, out_dir: str, *, full_trace: bool = False,
                   slowest: int | None = None) -> str:
    """Failures (one block each), skipped cells by reason, the per-target table, the
    ``slowest`` cells (``--durations N``; 0: all), the counts and the wall time."""
    lines: list[str] = []
    # Skipped cells were never run: one line per reason below, not a block each (a
    # one-GPU host skips most of a cuda matrix).
    bad = [(k, r) for k, r in report.results.items()
           if not r.status.ok and r.status is not Status.SKIPPED]
    order = {Status.CRASH: 0, Status.TIMEOUT: 1, Status.FAILED: 2, Status.SURVIVED: 3,
             Status.FLAKY: 4, Status.INFRA: 5, Status.NOT_JUDGED: 6, Status.INTERRUPTED: 7}
    bad.sort(key=lambda kr: order.get(kr[1].status, 9))
    if bad:
        lines.append("")
        lines.append(f"==== {len(bad)} not passed ====")
        for key, r in bad:
            lines.append("")
            lines.extend(failure_block(key, r, full_trace=full_trace))
    reasons: dict[str, int] = {}
    for r in report.results.values():
        if r.status is Status.SKIPPED:
            reasons[r.message] = reasons.get(r.message, 0) + 1
    if reasons:
        lines.append("")
        lines.append(f"==== {sum(reasons.values())} skipped ====")
        lines += [f"  {n} cells {why}" for why, n in sorted(reasons.items())]
    if report.results:
        lines.append("")
        lines += target_table(report.results.values())
    if slowest is not None and report.results:
        ran = sorted((r for r in report.results.values() if r.status is not Status.SKIPPED),
                     key=lambda r: -r.duration_s)
        shown = ran if slowest == 0 else ran[:slowest]
        lines.append("")
        lines.append(f"==== slowest {len(shown)} cells ====")
        lines += [f"  {r.duration_s:8.2f} s  {testcase_name(r.cell_id, r.mutant)}"
                  for r in shown]
    counts = report.counts()
    parts = [f"{counts.get(s.value, 0)} {s.label.lower()}" for s in Status if counts.get(s.value)]
    lines.append("")
    lines.append(
        f"==== {len(report.results)} cells: {', '.join(parts) or 'none'} in "
        f"{report.wall_s:.1f} s ({_count(report.worlds, 'planned world')}, "
        f"{_count(report.world_starts, 'world start')}) ===="
    )
    lines.append(f"report: {out_dir}/{REPORT_XML} (html: {out_dir}/{REPORT_HTML})")
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    """``1 planned world``, ``2 planned worlds``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def target_table(results: Iterable[Result]) -> list[str]:
    """One row per target: its cells, how many passed, did not pass, were skipped, and
    the cells' summed time (mutant runs counted with their target).

    >>> print("\\n".join(target_table([Result(cell_id="t[a]@cpu", status=Status.PASSED,
    ...                                      duration_s=1.5)])))
    target  cells  passed  failed  skipped   time
    t           1       1       0        0  1.5 s
    """
    rows: dict[str, list[float]] = {}
    for r in results:
        row = rows.setdefault(target_of(r.cell_id), [0, 0, 0, 0, 0.0])
        row[0] += 1
        if r.status.ok:
            row[1] += 1
        elif r.status is Status.SKIPPED:
            row[3] += 1
        else:
            row[2] += 1
        row[4] += r.duration_s
    head = ("target", "cells", "passed", "failed", "skipped", "time")
    body = [(t, *(f"{int(v)}" for v in row[:4]), f"{row[4]:.1f} s") for t, row in rows.items()]
    width = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]

    def fmt(cols: Sequence[str]) -> str:
        first = f"{cols[0]:<{width[0]}}"
        rest = "  ".join(f"{c:>{w}}" for c, w in zip(cols[1:], width[1:], strict=True))
        return f"{first}  {rest}"

    return [fmt(head), *(fmt(row) for row in body)]


class Console:
    """A run's lines on stdout and stderr, its progress, its summary (the
    :class:`~cpmatrix.supervise.pipeline.Hooks` of ``cpmatrix run``)."""

    def __init__(self, *, plain: bool, full_trace: bool = False, slowest: int | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.progress = Progress(self.stream, force_plain=plain)
        self.full_trace = full_trace
        self.slowest = slowest
        #: The run's report once summarized, and every warning said (for ``--json``).
        self.seen: RunReport | None = None
        self.said: list[str] = []

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def warn(self, line: str) -> None:
        self.said.append(line)
        print(line, file=sys.stderr)

    def launched(self, name: str, what: str, cells: int) -> None:
        """A phase line while a world starts (seconds before its first cell is done)."""
        self.progress.note(f"starting {what} ({name}) for {cells} cells ...")

    def start(self, total: int) -> None:
        self.progress.start(total)

    def result(self, entry: Entry, result: Result) -> None:
        self.progress.update(entry, result)

    def done(self) -> None:
        self.progress.stop()

    def summary(self, report: RunReport, out: Path) -> None:
        self.seen = report
        print(format_summary(report, os.path.relpath(out), full_trace=self.full_trace,
                             slowest=self.slowest), file=self.stream)
