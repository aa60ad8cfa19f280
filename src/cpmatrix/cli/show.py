"""``cpmatrix show CELL_ID``: one cell in full (or why it is excluded).

Example::

    $ cpmatrix show 'ring_attention[unit,2x2,fp64,autocast=off,reference,n=7]@cpu'
"""

from __future__ import annotations

import argparse
import json
import sys

from cpmatrix.cli.common import DEFAULT_MATRIX, load_and_expand
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.matrix.cellid import parse_cell_id

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("show", help="print one cell in full")
    p.add_argument("cell_id")
    p.add_argument("--matrix", default=DEFAULT_MATRIX)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        key = parse_cell_id(args.cell_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
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
