"""The plan stage's settings: how the executors cut cells into batches.

:class:`~cpmatrix.supervise.options.RunOptions` reads its flags' defaults from here
(``--batch-size``, ``--keep-order``, ``--runs-per-test``) and hands the section on as
``options.planning``; the plan (:func:`cpmatrix.plan.plan.make_plan`) is made with it.

Example::

    >>> PLAN_DEFAULTS.runs, PlanSettings(batch_size=4).batch_size
    (1, 4)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["PLAN_DEFAULTS", "PlanSettings"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanSettings:
    """How the executors cut cells into batches (``--batch-size``, ``--keep-order``,
    ``--runs-per-test``)."""

    batch_size: int | None = None
    keep_order: bool = False
    #: Each cell runs this many times (run numbers 1..N).
    runs: int = 1


#: A plain run's planning: one run of each cell, the planner's own order.
PLAN_DEFAULTS: Final = PlanSettings()
