"""Crashes the first time it runs in a checkout, passes when retried alone: FLAKY."""

import os
from pathlib import Path
from typing import Any

MARKER = Path(__file__).resolve().parent.parent / "crashed-once"


def case(cell: Any) -> None:
    if not MARKER.exists():
        MARKER.touch()
        os._exit(9)
    cell.record("value", 1.0)
