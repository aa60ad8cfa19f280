"""Reads a data file of the project: its observed set holds a file under $project."""

from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "data" / "value.txt"


def case(cell: Any) -> None:
    value = float(DATA.read_text())
    assert value == 3.0, f"data/value.txt holds {value}, not 3"
    print(f"alpha read {value}")  # its log travels with the cached pass
    cell.record("value", value)
