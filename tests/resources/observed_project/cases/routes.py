"""One cell per route by which a case reads code or data the static pre-key cannot see."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]


def editable(cell: Any) -> None:
    import userlib  # an editable install of the user's own package

    assert userlib.SCALE == 2.0, f"userlib.SCALE is {userlib.SCALE}"


def editable_again(cell: Any) -> None:
    # Imported by the cell before: no import happens here, the module is reused.
    userlib = sys.modules.get("userlib") or __import__("userlib")
    assert userlib.SCALE == 2.0, f"userlib.SCALE is {userlib.SCALE}"


def data_file(cell: Any) -> None:
    value = (PROJECT / "data" / "values.txt").read_text().strip()
    assert value == "1.0", f"data/values.txt holds {value}"


def importlib_path(cell: Any) -> None:
    # Loaded by path, never registered in sys.modules.
    spec = importlib.util.spec_from_file_location("by_path", PROJECT / "loose" / "by_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.VALUE == 1, f"by_path.VALUE is {module.VALUE}"


def sys_path_folder(cell: Any) -> None:
    sys.path.insert(0, os.fspath(PROJECT / "extra"))
    import extra_mod

    assert extra_mod.VALUE == 1, f"extra_mod.VALUE is {extra_mod.VALUE}"


def site_dropped(cell: Any) -> None:
    import dropped_mod  # a file in the interpreter's site-packages, of no distribution

    assert dropped_mod.VALUE == 1, f"dropped_mod.VALUE is {dropped_mod.VALUE}"


def pth_path(cell: Any) -> None:
    import pth_mod  # found through a .pth file's folder

    assert pth_mod.VALUE == 1, f"pth_mod.VALUE is {pth_mod.VALUE}"


def retried(cell: Any) -> None:
    # Crashes the first time it ever runs, passes when retried alone: FLAKY.
    marker = PROJECT / "crashed-once"
    if not marker.exists():
        marker.touch()
        os._exit(9)
