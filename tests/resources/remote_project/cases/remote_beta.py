"""A plain passing case (the tests edit it in one checkout: that checkout misses)."""

from typing import Any


def case(cell: Any) -> None:
    cell.record("value", 2.0)
