"""The ``cpmatrix`` command: parse arguments, call the pipeline, map to exit codes.

Exit codes: 0 ok, 1 test failures, 2 usage or spec error, 3 nothing selected.

Example::

    $ cpmatrix list --matrix matrix/parity.yaml -k "ring and 2x2" --json
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from cpmatrix.errors import ExitCode, SpecError, UsageError
from cpmatrix.matrix.cellid import parse_cell_id
from cpmatrix.matrix.expand import Expansion, expand
from cpmatrix.matrix.load import load_matrix
from cpmatrix.matrix.schema import Cell, Matrix
from cpmatrix.matrix.select import select_cells

__all__ = ["main"]

DEFAULT_MATRIX = "matrix/parity.yaml"


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as every other usage error does."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(message)


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", default=DEFAULT_MATRIX, help="matrix YAML (default: %(default)s)")
    p.add_argument("--platform", help="only cells of this platform (e.g. cpu, cuda)")
    p.add_argument("-k", dest="keyword", metavar="EXPR",
                   help="pytest-style keyword expression over ids, axis values and tags")
    p.add_argument("--tag", action="append", default=[], metavar="T",
                   help="only cells carrying this tag (repeatable: all must match)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cpmatrix", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p_list = sub.add_parser("list", help="expand the matrix and print the selected cells")
    _add_selection(p_list)
    p_list.add_argument("--json", action="store_true", help="print a JSON array of cells")
    p_list.add_argument("--why-excluded", action="store_true",
                        help="also print every combination left out, with its reason")

    p_show = sub.add_parser("show", help="print one cell in full")
    p_show.add_argument("cell_id")
    p_show.add_argument("--matrix", default=DEFAULT_MATRIX)

    from cpmatrix.cli.report import add_report_parsers
    from cpmatrix.cli.repro import add_repro_parser
    from cpmatrix.cli.run import add_run_parser

    add_run_parser(sub)
    add_repro_parser(sub)
    add_report_parsers(sub)
    return parser


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


def _cmd_list(args: argparse.Namespace) -> int:
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


def _cmd_show(args: argparse.Namespace) -> int:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        from cpmatrix.cli.report import cmd_gate, cmd_report
        from cpmatrix.cli.repro import cmd_repro
        from cpmatrix.cli.run import cmd_run

        handler = {"list": _cmd_list, "show": _cmd_show, "run": cmd_run, "spill": cmd_run,
                   "gate": cmd_gate, "report": cmd_report,
                   "repro": cmd_repro}[args.command]
        return int(handler(args))
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return 128 + int(getattr(exc, "signum", 2))
    except BrokenPipeError:
        return ExitCode.OK
    except Exception:  # a bug of cpmatrix: its own exit code, never 1 ("tests failed")
        print("cpmatrix: internal error (a bug; please report it with this traceback):\n"
              + traceback.format_exc(), file=sys.stderr)
        return ExitCode.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
