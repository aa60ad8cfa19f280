"""Every module of cpmatrix that is named as a string: run with ``-m``, or loaded by name.

A process cpmatrix starts (a world's ranks, the fork launcher, the watchdog, the spill
compiler, the collector of a ``pytest:`` target, the mutants' reader, the spill cross-check,
the image tool) and a case a world loads by its ``module:function`` name are reached
through a string, which no import check can follow. They are all spelled here, once; every
other module imports the constant (``tests/unit/test_architecture.py`` fails on one spelled
anywhere else in the package's code). Standard library only: the ranks import it.

Example::

    >>> PYTEST_CASE
    'cpmatrix.kinds.pytest.rank_session:case'
    >>> FORKRUN in WORKER_ENTRIES
    True
"""

from __future__ import annotations

from typing import Final

__all__ = ["BUNDLED_CASES", "COMPILE_MAIN", "DISCOVER_MAIN", "FORKRUN", "IMAGE_TOOL",
           "PYTEST_CASE", "PYTEST_COLLECTOR", "PYTEST_PREPARE", "PYTEST_RANK", "SPILL_CROSSCHECK",
           "WATCHDOG", "WORKER_ENTRIES", "WORLD_MAIN"]

#: One rank of a world: runs the cells placed on it (``python -m``).
WORLD_MAIN: Final = "cpmatrix.worker.world_main"
#: The fork launcher: imports torch once and forks the world's ranks (``python -m``).
FORKRUN: Final = "cpmatrix.worker.forkrun"
#: A container's watchdog in the host's pid namespace (``python -m``).
WATCHDOG: Final = "cpmatrix.worker.watchdog"
#: The spill kind's job: compiles a kernel and measures it (``python -m``).
COMPILE_MAIN: Final = "cpmatrix.worker.compile_main"
#: Reads the mutants each case declares, in a child of ``--python`` (``python -m``).
DISCOVER_MAIN: Final = "cpmatrix.worker.discover_main"
#: The modules that start cpmatrix's code in a world: everything they import, transitively,
#: runs there (the result cache's key covers their closure).
WORKER_ENTRIES: Final = (WORLD_MAIN, FORKRUN, WATCHDOG, COMPILE_MAIN)

#: The pytest kind's rank side: a rank's pytest session and one test per cell.
PYTEST_RANK: Final = "cpmatrix.kinds.pytest.rank_session"
#: A pytest cell's case: one collected test, run in the rank's session.
PYTEST_CASE: Final = f"{PYTEST_RANK}:case"
#: What each rank of a pytest world calls before its first cell (``WorldSpec.prepare``).
PYTEST_PREPARE: Final = f"{PYTEST_RANK}:prepare"
#: The collector of a ``pytest:`` matrix target (``python -m``).
PYTEST_COLLECTOR: Final = "cpmatrix.kinds.pytest.collect_main"

#: The spill gate's cross-check on a GPU (``python -m``).
SPILL_CROSSCHECK: Final = "cpmatrix.spill.crosscheck"
#: The docker runner's image tool (``python -m``).
IMAGE_TOOL: Final = "cpmatrix.supervise.runners.image"
#: The packages of cases cpmatrix ships (a world's namespaces treat them as the project's).
BUNDLED_CASES: Final = ("cpmatrix.suite", "cpmatrix.recipes")
