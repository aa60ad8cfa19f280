"""Where cpmatrix itself lives, from a source checkout or an installed wheel alike.

Nothing in cpmatrix resolves a path from its own source file's position but this module.

Example::

    >>> (PACKAGE_DIR / "cell.py").is_file(), (IMPORT_ROOT / "cpmatrix") == PACKAGE_DIR
    (True, True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = ["IMPORT_ROOT", "PACKAGE_DIR", "module_file"]

#: The ``cpmatrix`` package folder.
PACKAGE_DIR: Final = Path(__file__).resolve().parent
#: The folder holding the package: what a child process needs on ``PYTHONPATH`` to
#: import this very cpmatrix (``src/`` of a checkout, ``site-packages`` of a wheel).
IMPORT_ROOT: Final = PACKAGE_DIR.parent


def module_file(module: str) -> Path:
    """The source file of a ``cpmatrix.*`` module (``cpmatrix.worker.procs`` -> ``.../procs.py``).

    >>> module_file("cpmatrix.worker.procs").name
    'procs.py'
    """
    parts = module.split(".")
    assert parts[0] == "cpmatrix", module
    return PACKAGE_DIR.joinpath(*parts[1:]).with_suffix(".py")
