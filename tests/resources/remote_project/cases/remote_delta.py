"""Reads data/delta.txt without judging it (the tests edit it in one checkout: the
remote entry's observed set then differs there, a miss, and the cell runs)."""

from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "data" / "delta.txt"


def case(cell: Any) -> None:
    cell.record("value", float(DATA.read_text()))
