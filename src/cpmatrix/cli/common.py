"""What every command shares: the argument parser, the cell selection, its messages.

Example::

    >>> p = Parser(prog="cpmatrix")
    >>> add_selection(p)
    >>> p.parse_args(["-k", "ring and 2x2"]).keyword
    'ring and 2x2'
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from cpmatrix.errors import UsageError
from cpmatrix.matrix.expand import Expansion, expand
from cpmatrix.matrix.load import load_matrix
from cpmatrix.matrix.schema import Cell, Matrix
from cpmatrix.matrix.select import select_cells

__all__ = ["DEFAULT_MATRIX", "Parser", "absolute_path", "add_selection", "load_and_expand",
           "nothing_selected", "select_from_args"]

DEFAULT_MATRIX = "matrix/parity.yaml"


class Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as every other usage error does."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(message)


def absolute_path(text: str) -> str:
    """A path from the command line, made absolute once, at parse time (relative to the
    folder cpmatrix was started in, whatever folder later steps run in)."""
    return os.path.abspath(os.path.expanduser(text))


def add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", default=DEFAULT_MATRIX, type=absolute_path,
                   help="matrix YAML (default: %(default)s)")
    p.add_argument("--platform", help="only cells of this platform (e.g. cpu, cuda)")
    p.add_argument("-k", dest="keyword", metavar="EXPR",
                   help="pytest-style keyword expression over ids, axis values and tags")
    p.add_argument("--tag", action="append", default=[], metavar="T",
                   help="only cells carrying this tag (repeatable: all must match)")


def load_and_expand(path: str) -> tuple[Matrix, Expansion]:
    matrix = load_matrix(path)
    return matrix, expand(matrix)


def select_from_args(args: argparse.Namespace) -> tuple[Matrix, Expansion, list[Cell]]:
    """Load, expand and select; raise UsageError for an unknown platform."""
    matrix, expansion = load_and_expand(args.matrix)
    if args.platform is not None:
        names = [p.name for p in matrix.platforms]
        if args.platform not in names:
            raise UsageError(f"--platform {args.platform!r}: unknown (allowed: {', '.join(names)})")
    cells = select_cells(
        expansion.cells, platform=args.platform, keyword=args.keyword, tags=args.tag
    )
    return matrix, expansion, cells


def nothing_selected(args: argparse.Namespace, total: int, excluded: int | None = None) -> str:
    if total == 0:
        how_many = "every combination was" if excluded is None else (
            f"all {excluded} combinations were")
        return (
            f"nothing selected: {args.matrix} yields no cell: {how_many} excluded "
            "(see `cpmatrix list --why-excluded`)"
        )
    parts = []
    if args.platform:
        parts.append(f"--platform {args.platform}")
    if args.keyword:
        parts.append(f"-k {args.keyword!r}")
    for t in args.tag:
        parts.append(f"--tag {t}")
    how = " and ".join(parts) if parts else "the matrix"
    return f"nothing selected: {how} matched none of the {total} cells in {args.matrix}"
