"""``cpmatrix run --order matrix|reverse|random[:SEED]``: the order cells run in, chosen.

A cell's verdict must not depend on the cells that ran before it or beside it. ``--order``
makes that checkable: the same selection in matrix order, reversed, or shuffled by a
seed must give the same verdicts; a cell whose verdict changes depends on another cell
(a state leak, a shared file), and the seed reproduces the order that showed it.

The order replaces the planner's priority (widest, then longest first) in each world: under
``--pack slots`` (the default) a world starts, whenever ranks are free, the first cell in
that order that fits them; under ``--pack serial`` every cell runs alone, in exactly that
order. Either way the placement is planned without recorded durations, so the same
order gives the same placement (the same neighbours, the same predecessors on each rank)
on every run. ``--keep-order`` still runs one cell at a time grouped by size (widest
first), each size in this order (default ``matrix``). Shards (``--shard``) are cut first,
then ordered.

Example::

    >>> str(parse_order("random:42")), str(parse_order("reverse"))
    ('random:42', 'reverse')
    >>> arrange(["a", "b", "c"], parse_order("reverse"))
    ['c', 'b', 'a']
    >>> arrange(["a", "b", "c", "d"], parse_order("random:7")) == \\
    ...     arrange(["a", "b", "c", "d"], parse_order("random:7"))
    True
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from cpmatrix.errors import UsageError

__all__ = ["ORDERS", "Order", "arrange", "failed_first", "parse_order"]

#: The orders ``--order`` takes (``random`` with an optional ``:SEED``).
ORDERS: Final = ("matrix", "reverse", "random")
T = TypeVar("T")


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


C = TypeVar("C", bound=_HasId)


@dataclass(frozen=True, slots=True)
class Order:
    """An order and, for ``random``, its seed (always set once parsed)."""

    kind: str
    seed: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.seed}" if self.kind == "random" else self.kind


def parse_order(text: str) -> Order:
    """``matrix``, ``reverse``, ``random`` (a fresh seed) or ``random:SEED`` (an integer
    >= 0); :class:`UsageError` (exit 2) for anything else.

    >>> parse_order("random").seed is not None
    True
    >>> parse_order("sideways")
    Traceback (most recent call last):
    ...
    cpmatrix.errors.UsageError: --order 'sideways': must be matrix, reverse, random or random:SEED
    """
    kind, sep, seed = text.partition(":")
    if kind not in ORDERS or (sep and kind != "random"):
        raise UsageError(f"--order {text!r}: must be matrix, reverse, random or random:SEED")
    if kind != "random":
        return Order(kind)
    if not sep:
        return Order(kind, secrets.randbelow(2**32))
    if not seed.isdigit():
        raise UsageError(f"--order {text!r}: the seed must be an integer >= 0, got {seed!r}")
    return Order(kind, int(seed))


def failed_first(cells: Sequence[C], failed: Collection[str]) -> tuple[list[C], int]:
    """``--failed-first``: the cells in ``failed`` (those that did not pass when they last
    ran: ``last-failed.json``, what ``repro --failed`` reruns), then the rest, each group
    in the order given; and how many came first.

    >>> class C(str):
    ...     id = property(str.__str__)
    >>> failed_first([C("a"), C("b"), C("c")], {"b"})
    (['b', 'a', 'c'], 1)
    """
    first = [c for c in cells if c.id in failed]
    return first + [c for c in cells if c.id not in failed], len(first)


def arrange(items: Sequence[T], order: Order) -> list[T]:
    """``items`` (in matrix order) in ``order``."""
    out = list(items)
    if order.kind == "reverse":
        out.reverse()
    elif order.kind == "random":
        random.Random(order.seed).shuffle(out)
    return out
