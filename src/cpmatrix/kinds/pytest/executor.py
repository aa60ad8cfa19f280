"""The executor of ``pytest`` cells: worlds whose ranks each hold a pytest session.

A pytest cell (:mod:`cpmatrix.kinds.pytest.spec`) runs like any world cell, packed onto
the ranks of a world (:class:`~cpmatrix.kinds.world.job.WorldRun`), with two
differences:

- every rank first builds the pytest session its tests were collected in
  (``WorldSpec.prepare`` = :func:`cpmatrix.kinds.pytest.rank_session.prepare`); tests of different
  sessions (other rootdirs or command lines) never share a world;
- each result is judged from the ranks' own pytest reports
  (:func:`cpmatrix.kinds.pytest.records.judged_cell`): a skip agreed by every rank is
  ``skipped``, an expected failure ``passed``, a failure carries the failing rank's
  pytest report; the judgement goes on with the result, for the pytest front to replay.

A test marked ``isolated_world`` gets a world of its own.

Example::

    >>> PytestExecutor().name, PytestExecutor().retries_crashes
    ('pytest', True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from cpmatrix.kinds.pytest.records import judged_cell
from cpmatrix.kinds.pytest.spec import ISOLATED_TAG, KIND, cell_test
from cpmatrix.kinds.world.executor import WorldExecutor
from cpmatrix.kinds.world.job import WorldRun
from cpmatrix.matrix.schema import Cell, Platform
from cpmatrix.module_names import PYTEST_PREPARE
from cpmatrix.plan.batches import Batch
from cpmatrix.plan.packing import Packing, PackSpec
from cpmatrix.plan.settings import PlanSettings
from cpmatrix.result import Result, Status
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.entry import Entry

__all__ = ["PytestExecutor", "PytestWorldRun"]


class PytestWorldRun(WorldRun):
    """A world of pytest cells; each result judged from the ranks' pytest reports."""

    prepare = PYTEST_PREPARE

    def _with_folder(self, entry: Entry, result: Result) -> Result:
        """The result judged from the ranks' reports, with its working folder removed or
        named. A crash or a hang (a status judging keeps) is judged with the folder
        named: the verdict quotes the world's message, and the front replays it."""
        if result.status in (Status.CRASH, Status.TIMEOUT):
            return self._judged(entry, super()._with_folder(entry, result))
        return super()._with_folder(entry, self._judged(entry, result))

    def _judged(self, entry: Entry, result: Result) -> Result:
        nodeid = cell_test(entry.cell).get("nodeid", "")
        return judged_cell(self.context.out_root / entry.out_dir, entry.cell.world_size,
                           result, nodeid or None)


class PytestExecutor(WorldExecutor):
    """Pytest cells in worlds: one per pytest session, and one per isolated test."""

    name = "pytest"
    kinds: tuple[str, ...] = (KIND,)
    noun = "a pytest world"
    plural = "pytest worlds"
    supports_mutants = False

    def plan(self, cells: Sequence[Cell], settings: PlanSettings, *,
             durations: Mapping[str, float], worlds: int = 1, pack: PackSpec | None = None,
             mutants: Mapping[str, Sequence[str]] | None = None) -> list[Batch]:
        sessions: dict[str, list[Cell]] = {}
        for c in cells:
            sessions.setdefault(cell_test(c).get("session", ""), []).append(c)
        batches: list[Batch] = []
        for s, mine in enumerate(sessions.values()):
            shared = [c for c in mine if ISOLATED_TAG not in c.tags]
            alone = [c for c in mine if ISOLATED_TAG in c.tags]
            for prefix, group, size in ((f"pytest{s}", shared, settings.batch_size),
                                        (f"pytest{s}-isolated", alone, 1)):
                if not group:
                    continue
                for b in super().plan(group, replace(settings, batch_size=size),
                                      durations=durations, worlds=worlds, pack=pack):
                    batches.append(replace(b, name=f"{prefix}-{b.name}"))
        batches.sort(key=lambda b: -b.world_size)
        return batches

    def job(self, name: str, entries: Sequence[Entry], platform: Platform,
            context: RunContext, devices: tuple[int, ...], *,
            packing: Packing | None = None) -> PytestWorldRun:
        return PytestWorldRun(name, entries, platform, context, devices, packing=packing)
