"""``cpmatrix show CELL_ID``: one cell in full (or why it is excluded); with ``--history``,
its recorded runs (outcomes, flake rate, durations) from a ``durations.json``.

Example::

    $ cpmatrix show 'ring_attention[unit,2x2,fp64,autocast=off,reference,n=7]@cpu'
    $ cpmatrix show 'ring_attention[unit,2x2,fp64,autocast=off,reference,n=7]@cpu' \\
          --history --out out/parity-cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cpmatrix.cli.common import DEFAULT_MATRIX, absolute_path, load_and_expand
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.cellid import parse_cell_id
from cpmatrix.report.history import KEEP, CellHistory, read_histories

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("show", help="print one cell in full, or its recorded runs (--history)")
    p.add_argument("cell_id")
    p.add_argument("--matrix", default=DEFAULT_MATRIX)
    p.add_argument("--history", action="store_true",
                   help="print the cell's recorded runs (outcomes, flake rate, durations) "
                   "instead of its definition")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=absolute_path, metavar="DIR",
                       help="with --history: the run's (or merge's) output folder, whose "
                       "durations.json is read (default: out)")
    where.add_argument("--durations", type=absolute_path, metavar="FILE",
                       help="with --history: a durations.json to read")
    p.add_argument("--json", action="store_true", help="with --history: print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        key = parse_cell_id(args.cell_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.history:
        return _history(args)
    if args.out or args.durations or args.json:
        raise UsageError("--out, --durations and --json go with --history")
    _, expansion = load_and_expand(args.matrix)
    for c in expansion.cells:
        if c.id == args.cell_id:
            print(json.dumps(c.to_dict(), indent=2))
            return ExitCode.OK
    for e in expansion.excluded:
        if e.id == args.cell_id:
            print(f"{args.cell_id}: excluded by {e.reason}", file=sys.stderr)
            return ExitCode.NOTHING_SELECTED
    near = [c.id for c in expansion.cells if c.target == key.target][:5]
    hint = ("; cells of that target include: " + ", ".join(near)) if near else ""
    print(f"no cell {args.cell_id!r} in {args.matrix}{hint}", file=sys.stderr)
    return ExitCode.NOTHING_SELECTED


def _history(args: argparse.Namespace) -> int:
    """The cell's history: 0 printed, 2 no readable file, 3 no record of the cell."""
    path = (Path(args.durations) if args.durations
            else RunLayout(Path(args.out or "out")).durations)
    try:
        histories = read_histories(path)
    except FileNotFoundError:
        raise UsageError(f"--history: no {path} (a run's --out holds durations.json; "
                         "give --out DIR or --durations FILE)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--history: {exc}") from None
    history = histories.get(args.cell_id)
    if history is None:
        target = args.cell_id.split("[", 1)[0]
        near = sorted(c for c in histories if c.split("[", 1)[0] == target)[:5]
        hint = ("; cells of that target with a history: " + ", ".join(near)) if near else ""
        print(f"no history of {args.cell_id!r} in {path} ({len(histories)} cells recorded)"
              f"{hint}", file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    if args.json:
        print(json.dumps(_as_json(args.cell_id, history), indent=2))
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
