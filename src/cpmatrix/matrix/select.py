"""Selecting cells: ``--platform``, ``--tag`` and pytest-style ``-k`` expressions.

A ``-k`` word matches a cell when it is a case-insensitive substring of the cell's
id, or equals one of its tags. Words combine with ``and``, ``or``, ``not`` and
parentheses, as in pytest.

Example::

    >>> expr = parse_keyword_expr("ring and not 3x3")
    >>> expr.matches(["ring_attention[unit,2x2,fp64,autocast=off,reference]@cpu"])
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Cell

__all__ = ["KeywordExpr", "parse_keyword_expr", "select_cells"]

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
#: Deepest nesting of ``not`` and parentheses accepted in a ``-k`` expression.
_MAX_DEPTH = 100


@dataclass(frozen=True, slots=True)
class KeywordExpr:
    """A compiled ``-k`` expression."""

    source: str
    _fn: Callable[[Sequence[str]], bool]

    def matches(self, words: Sequence[str]) -> bool:
        """``words[0]`` is matched by substring; the rest (tags) must match exactly."""
        return self._fn(words)


def parse_keyword_expr(source: str) -> KeywordExpr:
    """Compile ``source``; :class:`UsageError` with the position on bad syntax."""
    tokens: list[tuple[str, int]] = []
    pos = 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:  # only trailing whitespace is left
            break
        tokens.append((m.group(1), m.start(1)))
        pos = m.end()
    i = 0

    def fail(message: str) -> UsageError:
        at = tokens[i][1] if i < len(tokens) else len(source)
        shown = source if len(source) <= 80 else source[:77] + "..."
        return UsageError(f"-k {shown!r}: {message} at column {at + 1}")

    def peek() -> str | None:
        return tokens[i][0] if i < len(tokens) else None

    depth = 0

    def nest() -> None:
        # Each ``not`` and ``(`` recurses; refuse absurd nesting before Python does.
        nonlocal depth
        depth += 1
        if depth > _MAX_DEPTH:
            raise fail(f"nested more than {_MAX_DEPTH} levels deep")

    def parse_or() -> Callable[[Sequence[str]], bool]:
        nonlocal i
        terms = [parse_and()]
        while peek() == "or":
            i += 1
            terms.append(parse_and())
        if len(terms) == 1:
            return terms[0]
        # n-ary, not a chain of pairs: "a or b or ... " stays one call deep.
        return lambda w: any(term(w) for term in terms)

    def parse_and() -> Callable[[Sequence[str]], bool]:
        nonlocal i
        terms = [parse_not()]
        while peek() == "and":
            i += 1
            terms.append(parse_not())
        if len(terms) == 1:
            return terms[0]
        return lambda w: all(term(w) for term in terms)

    def parse_not() -> Callable[[Sequence[str]], bool]:
        nonlocal i, depth
        if peek() == "not":
            i += 1
            nest()
            inner = parse_not()
            depth -= 1
            return lambda w: not inner(w)
        return parse_atom()

    def parse_atom() -> Callable[[Sequence[str]], bool]:
        nonlocal i, depth
        tok = peek()
        if tok is None:
            raise fail("expected a word or '('")
        if tok == "(":
            nest()
            i += 1
            inner = parse_or()
            if peek() != ")":
                raise fail("expected ')'")
            i += 1
            depth -= 1
            return inner
        if tok in (")", "and", "or"):
            raise fail(f"unexpected {tok!r}")
        i += 1
        word = tok.lower()
        return lambda w: word in w[0].lower() or any(word == x.lower() for x in w[1:])

    if not tokens:
        raise UsageError("-k: empty expression")
    fn = parse_or()
    if i != len(tokens):
        raise fail(f"unexpected {tokens[i][0]!r}")
    return KeywordExpr(source, fn)


def select_cells(
    cells: Iterable[Cell],
    *,
    platform: str | None = None,
    keyword: str | None = None,
    tags: Sequence[str] = (),
) -> list[Cell]:
    """The cells on ``platform`` that match ``keyword`` and carry every tag in ``tags``."""
    # ``-k ""`` is a mistake to report, not "no filter".
    expr = parse_keyword_expr(keyword) if keyword is not None else None
    out = []
    for cell in cells:
        if platform is not None and cell.platform != platform:
            continue
        if tags and not all(t in cell.tags for t in tags):
            continue
        if expr is not None and not expr.matches([cell.id, *cell.tags]):
            continue
        out.append(cell)
    return out
