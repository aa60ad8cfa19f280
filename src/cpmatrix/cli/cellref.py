"""A cell named on the command line: its full id, or any prefix of it that names one cell.

``cpmatrix repro allreduce_sum[unit,2x2,fp64`` is enough when one cell's id starts so;
a prefix two or more ids start with is refused (exit 2) listing them, so that the same
words never rerun another cell than meant; a name no id starts with is exit 3, with
the nearest ids.

Example::

    >>> ids = ["t[unit,1x2,fp64]@cpu", "t[unit,2x2,fp64]@cpu", "u[unit,1x1,fp64]@cpu"]
    >>> resolve_id("t[unit,2x2", ids)
    't[unit,2x2,fp64]@cpu'
    >>> resolve_id("t[", ids)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    cpmatrix.cli.cellref.Ambiguous: 't[' names 2 cells: t[unit,1x2,fp64]@cpu, ... of the id)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cpmatrix.errors import UsageError
from cpmatrix.result import target_of
from cpmatrix.suggest import closest

__all__ = ["Ambiguous", "NotFound", "resolve_id"]

#: Candidates listed for an ambiguous prefix.
_LISTED: Final = 10


class Ambiguous(UsageError):
    """A prefix of several ids (exit 2)."""


class NotFound(LookupError):
    """No id is or starts with the name (exit 3); ``near``: the closest ids."""

    def __init__(self, name: str, near: Sequence[str]) -> None:
        self.near = tuple(near)
        hint = f"; nearest: {', '.join(near)}" if near else ""
        super().__init__(f"no cell {name!r}{hint}")


def resolve_id(name: str, ids: Sequence[str]) -> str:
    """The one id ``name`` is, or is a prefix of."""
    if name in ids:
        return name
    hits = [i for i in ids if i.startswith(name)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        shown = ", ".join(hits[:_LISTED]) + (f", ... ({len(hits)} in all)"
                                             if len(hits) > _LISTED else "")
        raise Ambiguous(f"{name!r} names {len(hits)} cells: {shown} (give more of the id)")
    same_target = [i for i in ids if target_of(i) == target_of(name)]
    raise NotFound(name, closest(name, ids, n=3) or same_target[:3])
