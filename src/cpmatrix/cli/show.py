"""``cpmatrix show CELL``: a cell's last result (status, message, failing ranks, evidence,
logs, the repro line) and its definition; with ``--history``, its recorded runs
(outcomes, flake rate, durations) from a ``durations.json``.

CELL is a cell id or a prefix of exactly one (:mod:`cpmatrix.cli.cellref`). The result
is read from ``results.json`` of ``--out`` (the project's ``out``, else ``out``); with
no result there, the definition alone is printed (as JSON).

Example::

    $ cpmatrix show 'ring_attention[unit,2x2,fp64,autocast=off,reference,n=7]@cpu'
    $ cpmatrix show 'ring_attention[unit,2x2' --json
    $ cpmatrix show 'ring_attention[unit,2x2,fp64,autocast=off,reference,n=7]@cpu' \\
          --history --out out/parity-cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cpmatrix.cli.cellref import NotFound, resolve_id
from cpmatrix.cli.common import (
    absolute_path,
    add_command,
    add_matrix,
    load_and_expand,
    matrix_of,
)
from cpmatrix.cli.json_out import emit, show_doc
from cpmatrix.cli.show_result import last_results, result_lines
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.cellid import parse_cell_id
from cpmatrix.report.history import KEEP, CellHistory, read_histories
from cpmatrix.result import target_of

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "show", "print a cell's last result (or its recorded runs: --history)",
        "Print a cell's last result from the run in --out: its status, message, failing "
        "ranks with their traceback, evidence by rank, log files and the repro line; then "
        "its definition. CELL is an id or a prefix of exactly one.",
        ["cpmatrix show 'allreduce_sum[unit,2x2,fp64,autocast=off,reference]@cpu'",
         "cpmatrix show 'allreduce_sum[unit,2x2,fp64' --json",
         "cpmatrix show CELL --history              # outcomes and flake rate over runs"])
    p.add_argument("cell_id", metavar="CELL")
    add_matrix(p)
    p.add_argument("--history", action="store_true",
                   help="print the cell's recorded runs (outcomes, flake rate, durations) "
                   "instead of its definition")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=absolute_path, metavar="DIR",
                       help="the run's (or merge's) output folder: its results.json (and, "
                       "with --history, durations.json) (default: out)")
    where.add_argument("--durations-from", dest="durations", type=absolute_path,
                       metavar="FILE", help="with --history: a durations.json to read")
    p.add_argument("--durations", dest="old_durations", type=_old_durations,
                   help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (docs/cli-json.md)")
    p.add_argument("--full-trace", action="store_true",
                   help="show every frame of the failure's traceback")
    p.set_defaults(handler=run)


def _old_durations(text: str) -> str:
    """``show --durations FILE``, the spelling before ``--durations-from``: refused, naming
    the new one (``--durations N`` is the slowest cells of ``run``)."""
    raise argparse.ArgumentTypeError(f"is now --durations-from {text} (the durations.json "
                                     "to read with --history)")


def run(args: argparse.Namespace) -> int:
    if args.history:
        try:
            parse_cell_id(args.cell_id)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return _history(args)
    if args.durations:
        raise UsageError("--durations-from goes with --history")
    _, expansion = load_and_expand(matrix_of(args))
    ids = [c.id for c in expansion.cells]
    try:
        cell_id = resolve_id(args.cell_id, ids)
    except NotFound as exc:
        code, why = _not_a_cell(args, expansion, exc)
        print(why, file=sys.stderr)
        if args.json:
            emit(show_doc(code, None, None, None, [why]))
        return code
    cell = next(c for c in expansion.cells if c.id == cell_id)
    out = Path(args.out or "out")
    results = last_results(out, cell_id)
    if args.json:
        emit(show_doc(ExitCode.OK, cell.to_dict(), results[0] if results else None,
                      RunLayout(out).results if results else None,
                      [] if results else [f"no result of it in {RunLayout(out).results}"]))
        return ExitCode.OK
    if not results:
        print(json.dumps(cell.to_dict(), indent=2))
        print(f"no result of it in {RunLayout(out).results} (run it, or give --out DIR)",
              file=sys.stderr)
        return ExitCode.OK
    for r in results:
        print("\n".join(result_lines(r, out, full_trace=args.full_trace)))
    print(f"  from: {RunLayout(out).results}")
    print(f"  case: {cell.case}   mesh {cell.mesh} ({cell.world_size} ranks)   {cell.dtype}   "
          f"{cell.platform}   digest {cell.digest[:12]}")
    return ExitCode.OK


def _not_a_cell(args: argparse.Namespace, expansion: object, exc: NotFound
                ) -> tuple[int, str]:
    """Exit 3 and why: excluded (and by what), or no such cell (with the nearest ids)."""
    for e in getattr(expansion, "excluded", ()):
        if e.id == args.cell_id:
            return ExitCode.NOTHING_SELECTED, f"{args.cell_id}: excluded by {e.reason}"
    try:
        target = parse_cell_id(args.cell_id).target
    except ValueError as bad:
        if "]" in args.cell_id or "@" in args.cell_id:  # meant whole, not a prefix
            raise UsageError(str(bad)) from None
        target = target_of(args.cell_id)
    near = [c.id for c in getattr(expansion, "cells", ()) if c.target == target][:5]
    hint = ("; cells of that target include: " + ", ".join(near)) if near else (
        f"; nearest: {', '.join(exc.near)}" if exc.near else "")
    return ExitCode.NOTHING_SELECTED, f"no cell {args.cell_id!r} in {args.matrix}{hint}"


def _history(args: argparse.Namespace) -> int:
    """The cell's history: 0 printed, 2 no readable file, 3 no record of the cell."""
    path = (Path(args.durations) if args.durations
            else RunLayout(Path(args.out or "out")).durations)
    try:
        histories = read_histories(path)
    except FileNotFoundError:
        raise UsageError(f"--history: no {path} (a run's --out holds durations.json; "
                         "give --out DIR or --durations-from FILE)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--history: {exc}") from None
    history = histories.get(args.cell_id)
    if history is None:
        target = target_of(args.cell_id)
        near = sorted(c for c in histories if target_of(c) == target)[:5]
        hint = ("; cells of that target with a history: " + ", ".join(near)) if near else ""
        why = (f"no history of {args.cell_id!r} in {path} ({len(histories)} cells recorded)"
               f"{hint}")
        print(why, file=sys.stderr)
        if args.json:
            emit(show_doc(ExitCode.NOTHING_SELECTED, None, None, None, [why]))
        return ExitCode.NOTHING_SELECTED
    if args.json:
        emit(show_doc(ExitCode.OK, None, None, None, [], history=_as_json(args.cell_id,
                                                                           history)))
    else:
        print("\n".join(_as_text(args.cell_id, history, path)))
    return ExitCode.OK


def _as_json(cell_id: str, h: CellHistory) -> dict[str, object]:
    return {"cell_id": cell_id, "duration_s": h.duration_s, "passed": h.passed,
            "failed": h.failed, "flipped": h.flipped, "flake_rate": round(h.flake_rate, 4),
            "runs": [{"at": r.at, "outcome": r.outcome, "duration_s": r.duration_s}
                     for r in h.runs]}


def _as_text(cell_id: str, h: CellHistory, path: Path) -> list[str]:
    last = "never passed here" if h.duration_s is None else f"{h.duration_s:.3f} s"
    lines = [cell_id, f"history: {path} (the last {KEEP} runs are kept)",
             f"duration (last passing run): {last}"]
    if not h.runs:
        lines.append("runs: none recorded (a durations.json of the form before histories)")
        return lines
    verdict = (h.flip_summary() if h.flipped else
               "never flipped: every kept run " + ("passed" if h.failed == 0 else "failed"))
    lines.append(f"runs: {len(h.runs)} kept, {h.passed} passed, {h.failed} failed; "
                 f"flake rate {100 * h.flake_rate:.0f}%; {verdict}")
    for r in h.runs:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.at))
        lines.append(f"  {when} UTC  {r.outcome:<8} {r.duration_s:9.3f} s")
    return lines
