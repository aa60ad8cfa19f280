"""The executor registry: which executor runs which kind of cell (its ``kinds``).

Every kind of ``matrix.schema.KINDS`` is one executor's (tests/unit/test_one_home.py).

Example::

    >>> executor_for("parity").name, executor_for("spill").name, executor_for("pytest").name
    ('world', 'compile', 'pytest')
"""

from __future__ import annotations

from typing import Final

from cpmatrix.run.executors.base import Executor, Job
from cpmatrix.run.executors.compile import CompileExecutor
from cpmatrix.run.executors.pytest_world import PytestExecutor
from cpmatrix.run.executors.world_executor import WorldExecutor

__all__ = ["EXECUTORS", "Executor", "Job", "executor_for"]

#: Every executor, in the order a run starts their jobs (compiles take seconds: first).
EXECUTORS: Final[tuple[Executor, ...]] = (CompileExecutor(), WorldExecutor(), PytestExecutor())


def executor_for(kind: str) -> Executor:
    """The executor of cells of ``kind``; KeyError for a kind nothing runs."""
    for executor in EXECUTORS:
        if kind in executor.kinds:
            return executor
    raise KeyError(kind)
