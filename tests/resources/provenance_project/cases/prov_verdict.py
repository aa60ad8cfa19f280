from pathlib import Path
from typing import Any


def case(cell: Any) -> None:
    said = (Path(__file__).resolve().parents[1] / "verdict.txt").read_text().strip()
    assert said == "pass", f"verdict.txt says {said}"
