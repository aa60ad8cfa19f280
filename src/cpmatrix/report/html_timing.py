"""report.html's timings and history: per-world and per-cell times, and each target's
duration and flake history over its recorded runs as inline SVG (no outside assets).

- **Worlds** (``timings.json`` beside the report, written by the run): each job, what it
  was, its cells, when its first result came (start-up and the first cell) and its wall
  time. A merged report has none (each shard's folder has its own).
- **Slowest cells**: the cells' durations from the report (the world's time per cell and
  the case's own).
- **History** (``durations.json``, :mod:`cpmatrix.report.history`): per target, one bar
  per recorded run (runs are told apart by when they ended): its height the target's
  summed cell time, red where a cell failed in that run, and under it the share of the
  target's cells that flipped (passed and failed within the kept runs).

Example::

    >>> from cpmatrix.report.history import CellHistory, RunRecord
    >>> h = {"t[a]@cpu": CellHistory(runs=(RunRecord(1.0, "passed", 0.5),
    ...                                    RunRecord(2.0, "failed", 0.7)))}
    >>> svg = history_svg("t", target_runs(h)["t"])
    >>> svg.startswith("<svg") and svg.count("<rect") == 2
    True
"""

from __future__ import annotations

import html
import json
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cpmatrix.layout import RunLayout
from cpmatrix.report.history import CellHistory
from cpmatrix.report.read import ReportCell
from cpmatrix.result import target_of

__all__ = ["TargetRun", "history_section", "history_svg", "read_timings", "target_runs",
           "timings_section"]

_SLOWEST: Final = 10
_W: Final = 260
_H: Final = 44


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def read_timings(folder: Path) -> list[dict[str, Any]]:
    """The jobs of ``folder``'s ``timings.json`` (none when absent or unreadable: the page
    then says so; a report is never failed for it)."""
    try:
        data = json.loads(RunLayout(folder).timings.read_text())
        jobs = data.get("jobs", []) if isinstance(data, dict) else []
        return [j for j in jobs if isinstance(j, dict) and "name" in j]
    except (OSError, ValueError):
        return []


def _seconds(job: Mapping[str, Any], key: str) -> float | None:
    value = job.get(key)
    return float(value) if isinstance(value, int | float) else None


def timings_section(cells: Sequence[ReportCell], jobs: Sequence[Mapping[str, Any]]) -> str:
    """The worlds' table and the slowest cells' table."""
    out = ['<section id="timings"><h2>Timings</h2>']
    if jobs:
        rows = []
        for j in jobs:
            start = _seconds(j, "started_s") or 0.0
            first = _seconds(j, "first_result_s")
            end = _seconds(j, "ended_s")
            rows.append(
                f'<tr class="world"><td><code>{_e(j["name"])}</code></td>'
                f'<td>{_e(j.get("what", ""))}</td><td class="num">{_e(j.get("cells", ""))}</td>'
                f'<td class="num">{start:.2f} s</td>'
                f'<td class="num">{"-" if first is None else f"{first - start:.2f} s"}</td>'
                f'<td class="num">{"-" if end is None else f"{end - start:.2f} s"}</td></tr>')
        out.append('<table class="times" id="worlds"><thead><tr><th>world (job)</th><th>what'
                   '</th><th>cells</th><th>started at</th><th>first result after</th>'
                   f'<th>wall</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')
    else:
        out.append('<p class="hint">no world timings beside this report (a merged report, '
                   'or one written before timings.json)</p>')
    ran = sorted((c for c in cells if c.time or c.properties.get("duration")),
                 key=lambda c: -_duration(c))[:_SLOWEST]
    if ran:
        rows = [f'<tr class="cell"><td><code>{_e(c.name)}</code></td><td>{_e(c.status.value)}'
                f'</td><td class="num">{_duration(c):.3f} s</td><td class="num">'
                f'{_e(c.properties.get("case_time", "-"))} s</td></tr>' for c in ran]
        out.append(f'<table class="times" id="slowest"><thead><tr><th>slowest cells</th>'
                   '<th>status</th><th>time in its world</th><th>case alone</th></tr></thead>'
                   f'<tbody>{"".join(rows)}</tbody></table>')
    out.append("</section>")
    return "".join(out)


def _duration(c: ReportCell) -> float:
    try:
        return float(c.properties.get("duration") or c.time)
    except ValueError:
        return c.time


@dataclass(frozen=True, slots=True)
class TargetRun:
    """One recorded run of a target: when it ended, its cells, failures, summed time."""

    at: float
    cells: int
    failed: int
    seconds: float


def target_runs(history: Mapping[str, CellHistory]) -> dict[str, list[TargetRun]]:
    """Per target, its recorded runs, oldest first (a run's cells share its end time)."""
    acc: dict[str, dict[float, list[float]]] = defaultdict(dict)
    for cell_id, h in history.items():
        target = target_of(cell_id)
        for r in h.runs:
            row = acc[target].setdefault(round(r.at, 1), [0, 0, 0.0])
            row[0] += 1
            row[1] += 0 if r.passed else 1
            row[2] += r.duration_s
    return {t: [TargetRun(at, int(c), int(f), s) for at, (c, f, s) in sorted(runs.items())]
            for t, runs in sorted(acc.items())}


def history_svg(target: str, runs: Sequence[TargetRun], flake_share: float = 0.0) -> str:
    """Bars of the target's time per run (red: a cell failed in it) over a strip of the
    share of its cells that flipped: one inline SVG."""
    n = max(1, len(runs))
    top = max((r.seconds for r in runs), default=0.0) or 1.0
    bar = (_W - 4) / n
    parts = [f'<svg class="hist" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
             f'height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
             f'aria-label="{_e(target)}: duration and failures over {len(runs)} runs">']
    for i, r in enumerate(runs):
        h = max(1.0, (_H - 12) * r.seconds / top)
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.at))
        color = "#e03131" if r.failed else "#2f9e44"
        parts.append(
            f'<rect x="{2 + i * bar:.1f}" y="{_H - 10 - h:.1f}" width="{max(1.0, bar - 1):.1f}" '
            f'height="{h:.1f}" fill="{color}" data-failed="{r.failed}"><title>{_e(when)} UTC: '
            f"{r.cells} cells, {r.failed} failed, {r.seconds:.2f} s</title></rect>")
    width = (_W - 4) * min(1.0, flake_share)
    parts.append(f'<line x1="2" y1="{_H - 4}" x2="{_W - 2}" y2="{_H - 4}" stroke="#dee2e6" '
                 'stroke-width="4"/>')
    if width:
        parts.append(f'<line class="flake" x1="2" y1="{_H - 4}" x2="{2 + width:.1f}" '
                     f'y2="{_H - 4}" stroke="#f08c00" stroke-width="4"><title>'
                     f"{100 * flake_share:.0f}% of its cells flipped</title></line>")
    parts.append("</svg>")
    return "".join(parts)


def history_section(history: Mapping[str, CellHistory]) -> str:
    """One row per target: its runs' plot, the last run's time, its flipped cells."""
    per_target = target_runs(history)
    if not per_target:
        return ""
    cells: dict[str, list[CellHistory]] = defaultdict(list)
    for cell_id, h in history.items():
        cells[target_of(cell_id)].append(h)
    rows = []
    for target, runs in per_target.items():
        mine = cells[target]
        flipped = sum(1 for h in mine if h.flipped)
        share = flipped / len(mine) if mine else 0.0
        last = runs[-1]
        rows.append(
            f'<tr data-target="{_e(target)}"><th>{_e(target)}</th>'
            f"<td>{history_svg(target, runs, share)}</td>"
            f'<td class="num">{len(runs)}</td><td class="num">{last.seconds:.2f} s</td>'
            f'<td class="num">{flipped}/{len(mine)}</td></tr>')
    return ('<section id="history"><h2>History</h2><p class="hint">per target, one bar per '
            "recorded run (height: the target's summed cell time; red: a cell failed), the "
            "orange line: the share of its cells that flipped (durations.json)</p>"
            '<table class="times"><thead><tr><th>target</th><th>runs</th><th>kept</th>'
            "<th>last run</th><th>flipped cells</th></tr></thead><tbody>"
            f'{"".join(rows)}</tbody></table></section>')
