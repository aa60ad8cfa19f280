"""A plain passing case (the tests tamper with its stored blob on the server)."""

from typing import Any


def case(cell: Any) -> None:
    cell.record("value", 4.0)
