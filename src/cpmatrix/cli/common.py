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
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import NoReturn

from cpmatrix.errors import UsageError
from cpmatrix.kinds.pytest.collect import collect_target
from cpmatrix.matrix.case_check import check_cases
from cpmatrix.matrix.expand import Expansion, expand
from cpmatrix.matrix.load import NAME_A_MATRIX, load_matrix
from cpmatrix.matrix.schema import Cell, Matrix
from cpmatrix.matrix.select import select_cells
from cpmatrix.suggest import did_you_mean, suggestion

__all__ = ["NO_MATRIX", "Parser", "absolute_path", "add_command", "add_matrix", "add_selection",
           "excluded_counts", "keyword_hints", "load_and_expand", "matrix_of",
           "nothing_selected", "select_from_args"]

#: What to say when no matrix is named: by flag or by the project's table.
NO_MATRIX = f"no matrix: {NAME_A_MATRIX}"

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)")


class Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as every other usage error does, and
    suggests the nearest choice for a typo."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        m = _INVALID_CHOICE.search(message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group("choices"))
            message += did_you_mean(m.group("word"), choices)
        raise UsageError(message)


def add_command(sub: argparse._SubParsersAction, name: str,  # type: ignore[type-arg]
                summary: str, description: str, examples: Sequence[str]
                ) -> argparse.ArgumentParser:
    """A subcommand with its one-line summary (``cpmatrix --help``), its description and
    examples (``cpmatrix NAME --help``)."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=textwrap.fill(description, 88), epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def absolute_path(text: str) -> str:
    """A path from the command line, made absolute once, at parse time (relative to the
    folder cpmatrix was started in, whatever folder later steps run in)."""
    return os.path.abspath(os.path.expanduser(text))


def add_matrix(p: argparse.ArgumentParser, *, shown: bool = True) -> None:
    """``--matrix FILE``, the one declaration of the flag for every command that reads
    one matrix (``gate``'s repeatable ``--matrix`` is another flag: the cells a policy
    requires)."""
    p.add_argument("--matrix", default=None, type=absolute_path, metavar="PATH",
                   help="matrix YAML (default: matrix in [tool.cpmatrix] of pyproject.toml)"
                   if shown else argparse.SUPPRESS)


def add_selection(p: argparse.ArgumentParser) -> None:
    add_matrix(p)
    p.add_argument("--platform", help="only cells of this platform (e.g. cpu, cuda)")
    p.add_argument("-k", dest="keyword", metavar="EXPR",
                   help="pytest-style keyword expression over ids, axis values and tags")
    p.add_argument("--tag", action="append", default=[], metavar="T",
                   help="only cells carrying this tag (repeatable: all must match)")


def matrix_of(args: argparse.Namespace) -> str:
    """The matrix the command reads (``--matrix`` or the project's), or why there is none."""
    path: str | None = getattr(args, "matrix", None)
    if not path:
        raise UsageError(NO_MATRIX)
    return path


def load_and_expand(path: str) -> tuple[Matrix, Expansion]:
    matrix = load_matrix(path)
    return matrix, expand(matrix, collect=collect_target)


def select_from_args(args: argparse.Namespace, *, check: bool = True
                     ) -> tuple[Matrix, Expansion, list[Cell]]:
    """Load, expand and select; raise UsageError for an unknown platform. ``check``: the
    selected cells' case functions must exist (read statically; exit 2 naming where)."""
    matrix, expansion = load_and_expand(matrix_of(args))
    if args.platform is not None:
        names = [p.name for p in matrix.platforms]
        if args.platform not in names:
            hint = suggestion(args.platform, names)
            raise UsageError(f"--platform {args.platform!r}: unknown (allowed: "
                             f"{', '.join(names)})" + (f"; {hint}" if hint else ""))
    cells = select_cells(
        expansion.cells, platform=args.platform, keyword=args.keyword, tags=args.tag
    )
    if check:
        check_cases(matrix, cells)
    return matrix, expansion, cells


def excluded_counts(expansion: Expansion) -> str:
    """How many combinations each constraint and exclude clause removed, in one clause
    (``""`` when none was): ``; 2 removed by constraint kernel-not-fp64, 1 by exclude[0]``.
    """
    counts: Counter[str] = Counter()
    for e in expansion.excluded:
        if e.reason.startswith("constraint "):
            counts[e.reason.split(":", 1)[0]] += 1
        else:
            counts[e.reason.split(" (", 1)[0]] += 1
    if not counts:
        return ""
    parts = [f"{n} by {why}" for why, n in counts.most_common()]
    return (f"; {sum(counts.values())} combination(s) left out: " + ", ".join(parts)
            + " (--why-excluded lists them)")


def _unmatched_tags(args: argparse.Namespace, cells: Sequence[Cell]) -> list[str]:
    """A hint per ``--tag`` no cell carries: the nearest tag of the matrix."""
    tags = sorted({t for c in cells for t in c.tags})
    return [f"--tag {t!r} is on no cell{did_you_mean(t, tags)}"
            for t in getattr(args, "tag", None) or () if t not in tags]


def _unmatched_words(args: argparse.Namespace, cells: Sequence[Cell]) -> list[str]:
    """A hint per ``-k`` word that matches no cell at all: the nearest id part or tag."""
    if not getattr(args, "keyword", None):
        return []
    from cpmatrix.suggest import DTYPE_ALIASES

    words = [w for w in re.findall(r"[^\s()]+", args.keyword)
             if w not in ("and", "or", "not")]
    vocabulary: set[str] = set()
    for c in cells:
        vocabulary.update(re.split(r"[\[\],@]", c.id))
        vocabulary.update(c.tags)
    vocabulary.discard("")
    hints = []
    for word in words:
        low = word.lower()
        if any(low in c.id.lower() or low in (t.lower() for t in c.tags) for c in cells):
            continue
        hint = did_you_mean(word, sorted(vocabulary), aliases=DTYPE_ALIASES)
        hints.append(f"-k word {word!r} matches no cell{hint}")
    return hints


def keyword_hints(args: argparse.Namespace, expansion: Expansion) -> list[str]:
    """``-k`` words and ``--tag`` values that match none of the matrix's cells, each with
    its nearest word."""
    return _unmatched_words(args, expansion.cells) + _unmatched_tags(args, expansion.cells)


def nothing_selected(args: argparse.Namespace, total: int, excluded: int | None = None,
                     hints: Sequence[str] = ()) -> str:
    path = getattr(args, "matrix", None)
    if total == 0:
        how_many = "every combination was" if excluded is None else (
            f"all {excluded} combinations were")
        return (
            f"nothing selected: {path} yields no cell: {how_many} excluded "
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
    tail = "".join(f"\n  {h}" for h in hints)
    return f"nothing selected: {how} matched none of the {total} cells in {path}{tail}"
