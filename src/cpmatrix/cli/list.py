"""``cpmatrix list``: expand the matrix and print the selected cells.

Example::

    $ cpmatrix list --matrix matrix/parity.yaml -k "ring and 2x2" --json
"""

from __future__ import annotations

import argparse
import json
import sys

from cpmatrix.cli.common import add_selection, nothing_selected, select_from_args
from cpmatrix.errors import ExitCode

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("list", help="expand the matrix and print the selected cells")
    add_selection(p)
    p.add_argument("--json", action="store_true", help="print a JSON array of cells")
    p.add_argument("--why-excluded", action="store_true",
                   help="also print every combination left out, with its reason")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    _, expansion, cells = select_from_args(args)
    if args.json:
        print(json.dumps([c.to_dict() for c in cells], indent=1))
    else:
        for c in cells:
            print(c.id)
    if args.why_excluded:
        stream = sys.stderr if args.json else sys.stdout
        print(f"\n{len(expansion.excluded)} combinations excluded:", file=stream)
        for e in expansion.excluded:
            print(f"  {e.id}  <- {e.reason}", file=stream)
    if not cells:
        print(nothing_selected(args, len(expansion.cells), len(expansion.excluded)),
              file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    print(f"{len(cells)} of {len(expansion.cells)} cells selected", file=sys.stderr)
    return ExitCode.OK
