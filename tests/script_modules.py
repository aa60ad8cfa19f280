"""Load a project script that is no package module (``tools/*.py``, ``scripts/**.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["ROOT", "load_script"]

ROOT = Path(__file__).resolve().parent.parent


def load_script(relative: str, name: str) -> ModuleType:
    """The file ``ROOT/relative`` imported as module ``name`` (put in ``sys.modules`` first:
    a dataclass in it looks its module up while it is defined)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
