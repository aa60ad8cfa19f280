"""Cases that run a helper process: a native program and a Python script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]


def native_cat(cell: Any) -> None:
    out = subprocess.run(["cat", str(PROJECT / "data" / "values.txt")], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == "1.0", f"cat printed {out}"


def python_helper(cell: Any) -> None:
    # The helper reads data/reference.txt itself: the case never names it.
    out = subprocess.run([sys.executable, str(PROJECT / "reference.py")], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == "2.0", f"the reference helper printed {out}"
