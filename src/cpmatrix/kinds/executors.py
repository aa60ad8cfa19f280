"""The executor registry: the executor of each kind of cell, built here, above the core.

Every kind of ``matrix.schema.KINDS`` is one executor's (tests/unit/test_one_home.py).
The fronts (``cpmatrix run``, ``repro``, the pytest plugin) hand this tuple down to the
run's pipeline; the core asks it through
:func:`~cpmatrix.supervise.executors.base.executor_for`, the plan stage through
:func:`~cpmatrix.plan.plan.make_plan`, and neither names a kind's executor itself.

Example::

    >>> from cpmatrix.supervise.executors.base import executor_for
    >>> [executor_for(EXECUTORS, kind).name for kind in ("parity", "spill", "pytest")]
    ['world', 'compile', 'pytest']
"""

from __future__ import annotations

from typing import Final

from cpmatrix.kinds.compile.executor import CompileExecutor
from cpmatrix.kinds.pytest.executor import PytestExecutor
from cpmatrix.kinds.world.executor import WorldExecutor
from cpmatrix.supervise.executors.base import Executor

__all__ = ["EXECUTORS"]

#: Every executor, in the order a run starts their jobs (compiles take seconds: first).
EXECUTORS: Final[tuple[Executor, ...]] = (CompileExecutor(), WorldExecutor(), PytestExecutor())
