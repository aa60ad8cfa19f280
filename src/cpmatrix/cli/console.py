"""Human output: a progress bar on a terminal, plain lines otherwise; the summary; the
:class:`Console` that shows a run's pipeline (its :class:`~cpmatrix.run.pipeline.Hooks`).

The summary lists failures first, one block each (cell id, kind, rank, the first
lines of the traceback, where the files are), then the counts and the wall time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO

from cpmatrix.layout import REPORT_HTML, REPORT_XML
from cpmatrix.result import Result, Status
from cpmatrix.run.pipeline import Entry, RunReport

__all__ = ["Console", "Progress", "format_summary"]

_TRACE_LINES = 12


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

    def stop(self) -> None:
        if self._rich is not None:
            self._rich.stop()


def _failure_block(key: str, r: Result) -> list[str]:
    ranks = ",".join(map(str, r.failing_ranks)) or "-"
    kind = r.kind.value if r.kind else "-"
    lines = [f"{r.status.label} {key}", f"  kind: {kind}   rank(s): {ranks}"
             + (f"   attempts: {r.attempts}" if r.attempts > 1 else "")]
    if r.runs:  # --runs-per-test: the counts first, then each run that did not pass
        lines.append(f"  runs: {r.runs_passed}/{r.runs} passed")
        lines += [f"  {line}" for line in r.run_failures]
    elif r.message:
        lines.append(f"  {r.message}")
    for f in r.failures[:2]:
        lines.append(f"  rank {f.rank}: {f.message.splitlines()[0] if f.message else ''}"
                     + (f"  [check: {f.check}]" if f.check else ""))
        tb = [ln for ln in f.traceback.splitlines() if ln.strip()]
        if tb:
            shown = tb[-_TRACE_LINES:]
            if len(tb) > _TRACE_LINES:
                lines.append("    ...")
            lines += [f"    {ln}" for ln in shown]
    if not r.failures:
        for rank, tail in sorted(r.stderr_tails.items()):
            last = [ln for ln in tail.splitlines() if ln.strip()][-6:]
            if last:
                who = "launcher" if rank < 0 else f"rank {rank}"
                lines.append(f"  {who} log (last lines):")
                lines += [f"    {ln}" for ln in last]
    if r.out_dir:
        lines.append(f"  files: {r.out_dir}/")
    return lines


def format_summary(report: RunReport, out_dir: str) -> str:
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
            lines.extend(_failure_block(key, r))
    reasons: dict[str, int] = {}
    for r in report.results.values():
        if r.status is Status.SKIPPED:
            reasons[r.message] = reasons.get(r.message, 0) + 1
    if reasons:
        lines.append("")
        lines.append(f"==== {sum(reasons.values())} skipped ====")
        lines += [f"  {n} cells {why}" for why, n in sorted(reasons.items())]
    counts = report.counts()
    parts = [f"{counts.get(s.value, 0)} {s.label.lower()}" for s in Status if counts.get(s.value)]
    lines.append("")
    lines.append(
        f"==== {len(report.results)} cells: {', '.join(parts) or 'none'} in "
        f"{report.wall_s:.1f} s ({report.worlds} planned worlds, {report.world_starts} "
        f"world starts) ===="
    )
    lines.append(f"report: {out_dir}/{REPORT_XML} (html: {out_dir}/{REPORT_HTML})")
    return "\n".join(lines)


class Console:
    """A run's lines on stdout and stderr, its progress, its summary (the
    :class:`~cpmatrix.run.pipeline.Hooks` of ``cpmatrix run``)."""

    def __init__(self, *, plain: bool) -> None:
        self.progress = Progress(force_plain=plain)

    def say(self, line: str) -> None:
        print(line, flush=True)

    def warn(self, line: str) -> None:
        print(line, file=sys.stderr)

    def start(self, total: int) -> None:
        self.progress.start(total)

    def result(self, entry: Entry, result: Result) -> None:
        self.progress.update(entry, result)

    def done(self) -> None:
        self.progress.stop()

    def summary(self, report: RunReport, out: Path) -> None:
        print(format_summary(report, os.path.relpath(out)))
