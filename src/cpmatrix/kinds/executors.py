"""The executor registry: which executor runs which kind of cell (its ``kinds``).

Every kind of ``matrix.schema.KINDS`` is one executor's (tests/unit/test_one_home.py).

Example::

    >>> executor_for("parity").name, executor_for("spill").name, executor_for("pytest").name
    ('world', 'compile', 'pytest')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from cpmatrix.kinds.compile.executor import CompileExecutor
from cpmatrix.kinds.pytest.executor import PytestExecutor
from cpmatrix.kinds.world.executor import WorldExecutor
from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.batches import Batch
from cpmatrix.plan.packing import PackSpec
from cpmatrix.run.executors.base import Executor, Job
from cpmatrix.run.settings import PlanSettings

__all__ = ["EXECUTORS", "Executor", "Job", "executor_for", "plan_all"]

#: Every executor, in the order a run starts their jobs (compiles take seconds: first).
EXECUTORS: Final[tuple[Executor, ...]] = (CompileExecutor(), WorldExecutor(), PytestExecutor())


def executor_for(kind: str) -> Executor:
    """The executor of cells of ``kind``; KeyError for a kind nothing runs."""
    for executor in EXECUTORS:
        if kind in executor.kinds:
            return executor
    raise KeyError(kind)


def plan_all(cells: Sequence[Cell], settings: PlanSettings, *, durations: Mapping[str, float],
             worlds: int, pack: PackSpec | None,
             mutants: Mapping[str, Sequence[str]] | None = None,
             ) -> list[tuple[Executor, list[Batch]]]:
    """Every executor's batches of its own kinds' cells (each cell ``settings.runs``
    times; ``mutants`` only where the executor takes them), in :data:`EXECUTORS` order:
    what a run queues and what ``--dry-run`` prints."""
    return [(ex, ex.plan([c for c in cells if executor_for(c.kind) is ex
                          for _ in range(settings.runs)], settings, durations=durations,
                         worlds=worlds, pack=pack,
                         mutants=mutants if ex.supports_mutants else None))
            for ex in EXECUTORS]
