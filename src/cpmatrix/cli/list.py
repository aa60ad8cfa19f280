"""``cpmatrix list``: expand the matrix and print the selected cells.

Example::

    $ cpmatrix list -k "ring and 2x2" --json
"""

from __future__ import annotations

import argparse
import json
import sys

from cpmatrix.cli.common import (
    add_command,
    add_selection,
    excluded_counts,
    keyword_hints,
    nothing_selected,
    select_from_args,
)
from cpmatrix.errors import ExitCode

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "list", "expand the matrix and print the selected cells",
        "Expand the matrix into its cells and print the selected ones, one id a line. "
        "Every selected case function is checked to exist first (exit 2 naming where).",
        ["cpmatrix list", "cpmatrix list -k \"ring and 2x2\"",
         "cpmatrix list --tag release --json", "cpmatrix list --why-excluded"])
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
    hints = keyword_hints(args, expansion)
    if not cells:
        print(nothing_selected(args, len(expansion.cells), len(expansion.excluded), hints),
              file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    for hint in hints:
        print(f"note: {hint}", file=sys.stderr)
    print(f"{len(cells)} of {len(expansion.cells)} cells selected{excluded_counts(expansion)}",
          file=sys.stderr)
    return ExitCode.OK
