"""``report.html``: the whole matrix on one self-contained page (no network, no files).

Totals first, then every cell that did not pass with its traceback (``<details>``), then
the grid: one row per target (grouped by level), one column per mesh, and in each grid
cell one small square per cell, in a row per dtype, colored by status. Hovering a square
shows its evidence (errors against tolerance, spill bytes, failing ranks, message);
clicking pins it in a panel, and ``report.html#cell=<id>`` opens a cell directly. Mutant
runs are listed with the kill rate. A cell whose kept history (``durations.json`` beside
the report, :mod:`cpmatrix.report.history`) both passed and failed is marked *flipped*:
a dashed ring on its square, a line in its hover text, and a list under the totals.
Each failure shows the line that reruns it (``cpmatrix repro ...``) and its time; the
run's worlds and slowest cells, and each target's duration and flake history as inline
SVG, close the page (:mod:`cpmatrix.report.html_timing`).
All text from the report is escaped.

Example::

    >>> from pathlib import Path
    >>> write_html(Path("out/report.xml"), Path("out/report.html"))  # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from cpmatrix.fsutil import atomic_write_bytes
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.schema import DTYPES, LEVELS
from cpmatrix.report.history import CellHistory, load_run_history
from cpmatrix.report.html_assets import CSS as _CSS
from cpmatrix.report.html_assets import JS as _JS
from cpmatrix.report.html_timing import history_section, read_timings, timings_section
from cpmatrix.report.read import ReportCell, ReportError, read_report
from cpmatrix.result import Status

__all__ = ["STATUS_COLORS", "render_html", "write_html", "write_report_html"]

#: Fill color per status (also the legend); chosen to stay apart for common color blindness
#: by lightness as well as hue (crash is dark, cached light).
STATUS_COLORS: Final = {
    Status.PASSED: "#2f9e44",
    Status.CACHED: "#8fd9c2",
    Status.FAILED: "#e03131",
    Status.FLAKY: "#f08c00",
    Status.TIMEOUT: "#7048e8",
    Status.CRASH: "#7a0e0e",
    Status.SKIPPED: "#adb5bd",
    Status.INTERRUPTED: "#495057",
    Status.INFRA: "#1c7ed6",
}
#: Failures in the order a reader should look at them (as the console summary does).
_BAD_ORDER: Final = (Status.CRASH, Status.TIMEOUT, Status.FAILED, Status.FLAKY,
                     Status.INFRA, Status.INTERRUPTED)
_MESH_RE: Final = re.compile(r"^(\d+)x(\d+)\Z")
_NO_MESH: Final = "-"
#: Evidence shown first (and in the hover text), as ``(error, its tolerance)`` pairs.
_ERROR_PAIRS: Final = (("max_abs", "atol"), ("max_rel", "rtol"), ("max_abs_diff", "atol"),
                       ("max_rel_diff", "rtol"), ("max_abs_err", "atol"))
_SPILL_KEYS: Final = ("spill_store_bytes", "spill_load_bytes", "budget_bytes", "registers",
                      "stack_bytes")
_HOVER_OTHER: Final = 6


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _short(value: str) -> str:
    """A recorded number with 3 significant digits (the panel keeps the full value)."""
    try:
        return f"{float(value):.3g}"
    except ValueError:
        return value


# --------------------------------------------------------------------------- evidence


def evidence_lines(cell: ReportCell) -> list[str]:
    """The evidence a reader wants first, one line each: errors vs tolerance, spills.

    >>> c = ReportCell(name="x", status=Status.PASSED, properties={
    ...     "evidence.parity.max_abs": "3e-08", "evidence.parity.atol": "1e-07"})
    >>> evidence_lines(c)
    ['parity.max_abs = 3e-08  (atol 1e-07)']
    >>> evidence_lines(ReportCell(name="x", status=Status.FAILED, properties={
    ...     "evidence.max_abs_err@rank1": "1.0", "evidence.atol": "1e-07"}))
    ['max_abs_err@rank1 = 1  (atol 1e-07)']
    """
    ev = cell.evidence
    lines: list[str] = []
    for key in ev:
        # A failed cell's values are labelled by rank (``max_abs@rank1``): the same pairs.
        base, at, rank = key.partition("@rank")
        label, _, leaf = base.rpartition(".")
        for err, tol in _ERROR_PAIRS:
            if leaf == err:
                tol_key = f"{label}.{tol}" if label else tol
                tol_key = tol_key if tol_key in ev else f"{tol_key}{at}{rank}"
                tol_text = f"  ({tol} {_short(ev[tol_key])})" if tol_key in ev else ""
                lines.append(f"{key} = {_short(ev[key])}{tol_text}")
    if any(k in ev for k in _SPILL_KEYS[:2]):
        lines.append(
            f"spill stores {ev.get('spill_store_bytes', '-')} B, loads "
            f"{ev.get('spill_load_bytes', '-')} B (budget {ev.get('budget_bytes', '0')} B)"
            + (f", {ev['registers']} registers" if "registers" in ev else "")
            + (f", stack {ev['stack_bytes']} B" if "stack_bytes" in ev else ""))
    return lines


def hover_text(cell: ReportCell, mutants: Sequence[ReportCell] = ()) -> str:
    """The ``title`` of a square: id, status, evidence, ranks, message (plain text)."""
    p = cell.properties
    head = f"{cell.status.value.upper()}  {cell.cell_id}"
    lines = [head, f"{cell.axis('dtype')} · autocast={cell.axis('autocast')} · "
             f"{cell.axis('path')}" + (f" · {cell.axis('params')}" if cell.axis('params') else "")]
    if p.get("runs"):
        lines.append(f"runs: {p.get('runs_passed', '?')}/{p['runs']} passed")
    if p.get("failing_ranks"):
        lines.append(f"failing ranks: {p['failing_ranks']}")
    if cell.headline or p.get("message"):
        lines.append(cell.headline or p["message"])
    lines += evidence_lines(cell)
    shown = {ln.split(" ", 1)[0] for ln in lines}
    # The per-check verdict lines are long prose: the click panel has them.
    other = [f"{k} = {v}" for k, v in cell.evidence.items() if k not in shown
             and ".check." not in k and not k.endswith(("tol", ".tolerance"))
             and not k.startswith(_SPILL_KEYS)]
    lines += other[:_HOVER_OTHER] + ([f"... {len(other) - _HOVER_OTHER} more (click)"]
                                     if len(other) > _HOVER_OTHER else [])
    if mutants:
        killed = sum(1 for m in mutants if m.evidence.get("mutant_outcome") == "killed")
        lines.append(f"mutants: {killed}/{len(mutants)} killed")
    lines.append(f"{p.get('duration') or cell.time} s"
                 + (f", {p['attempts']} attempts" if p.get("attempts", "1") != "1" else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------- layout


def _mesh_key(mesh: str) -> tuple[int, int, int, str]:
    m = _MESH_RE.match(mesh)
    if m is None:  # spill cells and foreign ids have no mesh: last column
        return (1 << 30, 0, 0, mesh)
    r, c = int(m.group(1)), int(m.group(2))
    return (r * c, r, c, mesh)


def _order(values: Iterable[str], known: Sequence[str]) -> list[str]:
    """Known values in their canonical order, then the others alphabetically."""
    vals = set(values)
    return [v for v in known if v in vals] + sorted(vals - set(known))


def _square(index: int, cell: ReportCell, mutants: Sequence[ReportCell], flip: str = "") -> str:
    # The glyph tells squares of one dtype row apart without hovering.
    glyph = ("a" if cell.axis("autocast") == "on" else "") + (
        "k" if cell.axis("path") == "kernel" else "")
    survived = any(m.evidence.get("mutant_outcome") != "killed" for m in mutants)
    extra = ' data-mutants="survived"' if survived else ""
    if flip:
        extra += ' data-flipped="1"'
    title = hover_text(cell, mutants) + (f"\n{flip}" if flip else "")
    return (f'<button class="sq" type="button" data-i="{index}" '
            f'data-status="{cell.status.value}"{extra} title="{_e(title)}">'
            f"{_e(glyph)}</button>")


def _grid(cells: Sequence[ReportCell], mutants: dict[str, list[ReportCell]],
          flips: Mapping[str, str]) -> str:
    index = {id(c): i for i, c in enumerate(cells)}
    meshes = sorted({c.axis("mesh") or _NO_MESH for c in cells}, key=_mesh_key)
    platforms = {c.platform for c in cells}
    rows: dict[tuple[str, str, str], list[ReportCell]] = defaultdict(list)
    for c in cells:
        rows[(c.axis("level"), c.axis("target"), c.platform)].append(c)
    out = ['<table class="grid"><thead><tr><th class="corner">target</th>']
    out += [f'<th class="mesh">{_e(m)}</th>' for m in meshes]
    out.append("</tr></thead><tbody>")
    for level in _order({k[0] for k in rows}, LEVELS):
        out.append(f'<tr class="level"><th colspan="{len(meshes) + 1}">'
                   f"{_e(level or 'other')}</th></tr>")
        for key in sorted(k for k in rows if k[0] == level):
            out.append(_grid_row(key, rows[key], meshes, len(platforms) > 1, index, mutants,
                                 flips))
    out.append("</tbody></table>")
    return "".join(out)


def _grid_row(key: tuple[str, str, str], cells: list[ReportCell], meshes: list[str],
              show_platform: bool, index: dict[int, int],
              mutants: dict[str, list[ReportCell]], flips: Mapping[str, str]) -> str:
    _, target, platform = key
    counts = Counter(c.status for c in cells)
    summary = " ".join(f'<span class="n" data-status="{s.value}">{counts[s]}</span>'
                       for s in Status if counts[s])
    tags = cells[0].tags
    label = _e(target) + (f' <span class="plat">@{_e(platform)}</span>' if show_platform else "")
    tag_html = "".join(f'<span class="tag">{_e(t)}</span>' for t in tags)
    out = [f'<tr class="target" data-target="{_e(target)}"><th><div class="tname">{label}</div>'
           f'<div class="tmeta">{tag_html}{summary}</div></th>']
    by_mesh: dict[str, list[ReportCell]] = defaultdict(list)
    for c in cells:
        by_mesh[c.axis("mesh") or _NO_MESH].append(c)
    for mesh in meshes:
        here = by_mesh.get(mesh, [])
        if not here:
            out.append('<td class="empty"></td>')
            continue
        out.append("<td>")
        for dtype in _order({c.axis("dtype") for c in here}, DTYPES):
            group = sorted((c for c in here if c.axis("dtype") == dtype),
                           key=lambda c: (c.axis("path"), c.axis("autocast"), c.axis("params")))
            squares = "".join(_square(index[id(c)], c, mutants.get(c.cell_id, ()),
                                      flips.get(c.cell_id, "")) for c in group)
            out.append(f'<div class="dt"><span class="dtl">{_e(dtype or "·")}</span>'
                       f"{squares}</div>")
        out.append("</td>")
    out.append("</tr>")
    return "".join(out)


def _failures(runs: Sequence[ReportCell]) -> str:
    bad = [c for c in runs if c.status in _BAD_ORDER]
    bad.sort(key=lambda c: _BAD_ORDER.index(c.status))
    skipped = [c for c in runs if c.status is Status.SKIPPED]
    if not bad and not skipped:
        return '<section id="failures"><h2>Not passed</h2><p class="ok">Every cell passed.</p>' \
               "</section>"
    out = [f'<section id="failures"><h2>Not passed ({len(bad)})</h2>']
    for c in bad:
        lines = evidence_lines(c)
        ev = f'<div class="ev">{"<br>".join(_e(x) for x in lines)}</div>' if lines else ""
        head = c.headline or c.properties.get("message", "") or c.status.value
        repro = c.properties.get("repro", "")
        line = (f'<div class="repro" title="reruns this cell alone">$ <code>{_e(repro)}</code>'
                "</div>") if repro else ""
        took = c.properties.get("duration", "")
        out.append(
            f'<details class="failure" data-status="{c.status.value}" id="f-{_e(c.name)}">'
            f'<summary><span class="badge" data-status="{c.status.value}">'
            f"{_e(c.status.value)}</span> <code>{_e(c.name)}</code>"
            + (f' <span class="took">{_e(took)} s</span>' if took else "")
            + f'<div class="head">{_e(head)}</div>{line}</summary>{ev}'
            f"<pre>{_e(c.text or head)}</pre></details>")
    if skipped:
        items = "".join(f"<li><code>{_e(c.name)}</code> {_e(c.headline)}</li>" for c in skipped)
        out.append(f'<details class="skipped"><summary>{len(skipped)} skipped</summary>'
                   f"<ul>{items}</ul></details>")
    out.append("</section>")
    return "".join(out)


def _mutant_rows(runs: Iterable[ReportCell], killed: bool) -> str:
    rows = []
    for r in sorted(runs, key=lambda r: r.name):
        outcome = r.evidence.get("mutant_outcome") or r.status.value
        # A kill names the check that caught the bug; anything else needs the message.
        why = r.evidence.get("killed_by", "") if killed else (
            r.properties.get("message") or r.headline)
        rows.append(f'<tr data-outcome="{_e(outcome)}"><td><code>{_e(r.cell_id)}</code></td>'
                    f"<td>{_e(r.mutant)}</td><td>{_e(outcome)}</td><td>{_e(why)}</td></tr>")
    head = ("<thead><tr><th>cell</th><th>mutant</th><th>outcome</th>"
            f"<th>{'killed by' if killed else 'why it counts as not killed'}</th></tr></thead>")
    return f'<table class="mut">{head}<tbody>{"".join(rows)}</tbody></table>'


def _mutants(runs: Sequence[ReportCell]) -> str:
    """Kill rate, the mutants not killed (each makes some test vacuous), the kills folded."""
    if not runs:
        return ""
    killed = [r for r in runs if r.evidence.get("mutant_outcome") == "killed"]
    alive = [r for r in runs if r not in killed]
    judged = [r for r in runs if r.status is not Status.NOT_JUDGED]
    rate = 100 * len(killed) / len(judged) if judged else 100.0
    unjudged = len(runs) - len(judged)
    note = f", {unjudged} not judged" if unjudged else ""
    out = [f'<section id="mutants"><h2>Mutants: {len(killed)}/{len(judged)} killed '
           f'(<span id="kill-rate">{rate:.1f}%</span>{note})</h2>']
    if alive:
        out.append(_mutant_rows(alive, killed=False))
    if killed:
        out.append(f'<details class="kills"><summary>{len(killed)} killed</summary>'
                   f"{_mutant_rows(killed, killed=True)}</details>")
    out.append("</section>")
    return "".join(out)


def _totals(cells: Sequence[ReportCell], runs: Sequence[ReportCell]) -> str:
    counts = Counter(c.status for c in cells)
    chips = "".join(
        f'<button type="button" class="total" data-status="{s.value}" data-count="{counts[s]}"'
        f' title="show only {s.value} cells">{counts[s]} {s.value}</button>'
        for s in Status if counts[s])
    killed = sum(1 for r in runs if r.evidence.get("mutant_outcome") == "killed")
    judged = sum(1 for r in runs if r.status is not Status.NOT_JUDGED)
    mut = ""
    if runs:
        full = "all" if killed == len(runs) else "some"
        rate = 100 * killed / judged if judged else 100.0
        mut = (f'<a class="mline" data-killed="{full}" href="#mutants">mutants: {killed}/'
               f"{judged} killed ({rate:.1f}%)</a>")
    return (f'<div id="totals"><span class="count" data-cells="{len(cells)}">{len(cells)} cells'
            f"</span>{chips}{mut}</div>")


def _data(cells: Sequence[ReportCell], mutants: dict[str, list[ReportCell]]) -> str:
    """Per-cell data for the click panel, as JSON safe inside ``<script>``."""
    rows: list[dict[str, Any]] = []
    for c in cells:
        rows.append({
            "id": c.cell_id, "status": c.status.value, "headline": c.headline,
            "highlights": evidence_lines(c),
            "props": {k: v for k, v in c.properties.items() if not k.startswith("evidence.")},
            "evidence": c.evidence,
            "mutants": [[m.mutant, m.evidence.get("mutant_outcome") or m.status.value,
                         m.evidence.get("killed_by", "")] for m in mutants.get(c.cell_id, ())],
            "failed": c.status in _BAD_ORDER,
        })
    text = json.dumps(rows, separators=(",", ":"))
    # Inside <script> only "</script" and "<!--" are dangerous; escaping every < > & covers both.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _flipped(cells: Sequence[ReportCell], flips: Mapping[str, str]) -> str:
    """The cells of the report whose history flipped, one line each (nothing when none)."""
    mine = [(c.cell_id, flips[c.cell_id]) for c in cells if c.cell_id in flips]
    if not mine:
        return ""
    items = "".join(f'<li><code>{_e(cell)}</code>: {_e(line)}</li>' for cell, line in mine)
    return (f'<section id="flipped"><h2>Flipped in their history ({len(mine)})</h2>'
            f"<ul>{items}</ul></section>")


def render_html(cells: Sequence[ReportCell], source: str = "",
                history: Mapping[str, CellHistory] | None = None,
                jobs: Sequence[Mapping[str, Any]] = ()) -> str:
    """The page for a report's cells (mutant runs are told apart by their name).

    ``source``: the report's path, shown under the title; ``history``: the cells' recorded
    runs (those that flipped are marked; each target's plotted); ``jobs``: the run's
    worlds and their timings (:mod:`cpmatrix.report.html_timing`).
    """
    flips = {c: line for c, h in (history or {}).items() if (line := h.flip_summary())}
    title = "cpmatrix report"
    plain = [c for c in cells if not c.mutant]
    runs = [c for c in cells if c.mutant]
    mutants: dict[str, list[ReportCell]] = defaultdict(list)
    for r in runs:
        mutants[r.cell_id].append(r)
    css_status = "".join(
        f'[data-status="{s.value}"]{{--c:{color}}}'
        f'body[data-only="{s.value}"] .sq:not([data-status="{s.value}"]){{opacity:.12}}'
        for s, color in STATUS_COLORS.items())
    legend = "".join(f'<span class="lg"><i data-status="{s.value}"></i>{s.value}</span>'
                     for s in Status)
    if runs:
        legend += '<span class="lg"><i class="ring"></i>a mutant survived</span>'
    if any(c.cell_id in flips for c in plain):
        legend += '<span class="lg"><i class="flip"></i>flipped in its history</span>'
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<style>{_CSS}{css_status}</style></head><body>"
        f'<header><h1>{_e(title)} <span class="src">{_e(source)}</span></h1>'
        f"{_totals(plain, runs)}</header><main>"
        f"{_failures(plain)}{_flipped(plain, flips)}"
        f'<section id="matrix"><h2>Matrix</h2><p class="legend">{legend}'
        '<span class="hint">one square per cell, a row per dtype; <b>a</b> autocast on, '
        "<b>k</b> kernel path; hover for evidence, click to pin</span></p>"
        f'{_grid(plain, mutants, flips)}<aside id="detail" hidden></aside></section>'
        f"{_mutants(runs)}{timings_section(plain, jobs)}{history_section(history or {})}"
        "</main>"
        f'<script type="application/json" id="cpm-data">{_data(plain, mutants)}</script>'
        f"<script>{_JS}</script></body></html>"
    )


def write_html(report: Path, out: Path) -> None:
    """Render ``report`` (a merged ``report.xml``) to ``out`` (``report.html``).

    Raises :class:`cpmatrix.gate.ReportError` for an unreadable report.
    """
    # The history beside the report (a run's or a merge's --out); none is no mark.
    history = load_run_history(report.parent)
    page = render_html(read_report(report), source=os.fspath(report), history=history,
                       jobs=read_timings(report.parent))
    atomic_write_bytes(os.fspath(out), page.encode("utf-8"))


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def write_report_html(out: Path, warn: Callable[[str], None] = _to_stderr) -> None:
    """``out``'s report.html from its report.xml (a run's or a merge's ``--out``); a
    rendering problem never fails the run: it is a warning, handed to ``warn``."""
    layout = RunLayout(out)
    try:
        write_html(layout.report_xml, layout.report_html)
    except (ReportError, OSError) as exc:
        warn(f"warning: report.html not written: {exc}")
