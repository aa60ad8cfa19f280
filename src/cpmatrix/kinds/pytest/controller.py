"""``pytest --cpmatrix``: the run loop that sends multi-rank tests to cpmatrix's worlds.

Registered by the plugin when ``--cpmatrix`` is given, it takes over pytest's run loop
(``pytest_runtestloop``), as pytest-xdist's controller does:

1. the tests that need no ranks (:func:`~cpmatrix.kinds.pytest.dialects.placement` is
   None) run here first, one by one, exactly as pytest runs them;
2. the multi-rank ones become cells (:func:`~cpmatrix.kinds.pytest.spec.cells_for`) and
   run in persistent worlds (:func:`~cpmatrix.kinds.pytest.adapter.run_tests`); each is
   reported through pytest's own hooks as its cell finishes
   (``pytest_runtest_logstart``/``logreport``/``logfinish``, the ranks' warnings too).

``-x``/``--maxfail`` stop the worlds at the failure that reaches the limit; Ctrl-C stops
them and the tests that finished stay reported (``--junitxml`` holds them); the exit
codes are pytest's.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from cpmatrix.errors import UsageError
from cpmatrix.kinds.pytest.adapter import FrontSettings, run_tests
from cpmatrix.kinds.pytest.exits import SessionExit
from cpmatrix.kinds.pytest.items import session_of, tests_of
from cpmatrix.kinds.pytest.records import judgement
from cpmatrix.kinds.pytest.reports import (
    replay_left_state,
    replay_warnings,
    reports_for,
    subreports_for,
)
from cpmatrix.kinds.pytest.spec import PytestTest, cell_test, cells_for
from cpmatrix.kinds.pytest.verdict import Verdict
from cpmatrix.matrix.schema import Platform
from cpmatrix.result import Result, Status
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.executors.spare import Spare
from cpmatrix.supervise.pipeline import RunReport
from cpmatrix.supervise.stopping import StopRequested

__all__ = ["Controller"]


class Controller:
    """The ``--cpmatrix`` run loop (a pytest plugin object)."""

    def __init__(self, config: Any, settings: FrontSettings, platform: Platform,
                 timeout_s: int, spare: Spare | None = None) -> None:
        self.config = config
        #: The first world's launcher, started at configure (None: none); the plugin
        #: ends it with the session (a config cleanup) whether a world took it or not.
        self.spare = spare
        self.settings = settings
        self.platform = platform
        self.timeout_s = timeout_s
        self.report: RunReport | None = None
        self.tests = 0
        self._items: dict[str, Any] = {}
        #: Per item, the cells still running (a DeepSpeed-style list of sizes: several).
        self._pending: dict[str, list[str]] = {}
        self._done: dict[str, list[tuple[str, Verdict, Any, Result, Entry]]] = {}
        self._warned: set[tuple[str, str, str, int]] = set()
        self._stopping = False
        self._exit = SessionExit(())

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: Any) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error"
                                      f"{'s' if session.testsfailed != 1 else ''} during "
                                      "collection")
        if session.config.option.collectonly:
            return True
        notes: list[str] = []
        local, tests = tests_of(session.items, self.config, notes=notes)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for note in _per_class(notes):
            if reporter is not None:
                reporter.write_line(f"cpmatrix: {note}")
        for i, item in enumerate(local):
            nextitem = local[i + 1] if i + 1 < len(local) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            self._check_stop(session)
        if tests:
            self._run_worlds(session, tests)
        return True

    def _check_stop(self, session: Any) -> None:
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)

    def _run_worlds(self, session: Any, tests: list[PytestTest]) -> None:
        by_nodeid = {item.nodeid: item for item in session.items}
        cells = cells_for(tests, session_of(self.config), platform=self.platform,
                          timeout_s=self.timeout_s)
        self.tests = len(tests)
        self._exit = SessionExit([item.nodeid for item in session.items])
        for cell in cells:
            nodeid = cell_test(cell)["nodeid"]
            self._items[cell.id] = by_nodeid[nodeid]
            self._pending.setdefault(nodeid, []).append(cell.id)
        try:
            self.report = run_tests(cells, self.settings, platform=self.platform,
                                    on_result=self._on_result, spare=self.spare)
        except UsageError as exc:
            raise pytest.UsageError(f"cpmatrix: {exc}") from None
        if self._exit.exit is not None:
            pytest.exit(self._exit.exit[0], returncode=self._exit.exit[1])
        if self._stopping:
            self._check_stop(session)
        if self.report.stopped_by is not None:
            name = signal.Signals(self.report.stopped_by).name
            if self.report.stopped_by == signal.SIGINT:
                raise KeyboardInterrupt(f"cpmatrix: stopped by {name}")
            pytest.exit(f"cpmatrix: stopped by {name}; the finished tests are reported",
                        returncode=128 + int(self.report.stopped_by))

    def _on_result(self, entry: Entry, result: Result) -> None:
        if result.status is Status.INTERRUPTED:
            return  # never finished: not reported, as pytest does for tests not run
        item = self._items[entry.cell.id]
        judged = judgement(self.settings.out / entry.out_dir, entry.cell.world_size,
                           result, item.nodeid)  # the job's, handed on with the result
        verdict, records = judged.verdict, judged.records
        pending = self._pending[item.nodeid]
        if entry.cell.id in pending:  # not after an exit cleared it
            pending.remove(entry.cell.id)
        if self._exit.note(item.nodeid, records) or not self._exit.reports(item.nodeid):
            pending.clear()  # natively never reported: the session ended before it
        else:
            self._done.setdefault(item.nodeid, []).append(
                (str(entry.cell.mesh), verdict, records, result, entry))
            if pending:
                return
            self._log(item, self._done.pop(item.nodeid))
        session = item.session
        stop = session.shouldfail or session.shouldstop or self._exit.settled(self._pending)
        if stop and not self._stopping:
            self._stopping = True
            raise StopRequested(signal.SIGINT)  # the run stops its worlds; we re-raise

    def _log(self, item: Any, done: list[tuple[str, Verdict, Any, Result, Entry]]) -> None:
        _, verdict, records, result, entry = _worst(done)
        hook = item.ihook
        hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = reports_for(item, verdict, records, result, self.config,
                              cell_dir=self.settings.out / entry.out_dir,
                              size=entry.cell.world_size)
        if len(done) > 1:
            note = "; ".join(f"world {m}: {v.summary()}" for m, v, _, _, _ in done)
            for r in reports:
                r.sections.append(("cpmatrix: every world of the test", note))
        subtests = subreports_for(verdict, records, self.config)
        for report in reports:
            if report.when == "call":
                for sub in subtests:
                    hook.pytest_runtest_logreport(report=sub)
            hook.pytest_runtest_logreport(report=report)
        replay_warnings(self.config, item, records, self._warned)
        replay_left_state(self.config, item, verdict)
        hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)

    def summary_line(self) -> str:
        if self.report is None:
            return ""
        worlds = self.report.planned.get("pytest", 0)
        starts = self.report.starts.get("pytest", 0)
        return (f"cpmatrix: {self.tests} multi-rank tests in {worlds} world"
                f"{'s' if worlds != 1 else ''} ({starts} world start"
                f"{'s' if starts != 1 else ''}), {self.report.wall_s:.1f} s; ranks' logs "
                f"and reports in {self.settings.out}")


#: Outcomes worst first: of a test's worlds, the worst one tells its outcome (_worst).
_WORST_FIRST = {"failed": 0, "error": 0, "skipped": 1, "xfailed": 2, "xpassed": 3, "passed": 4}


_Done = tuple[str, Verdict, Any, Result, Entry]


def _worst(done: list[_Done]) -> _Done:
    """Of a test's worlds (one per size), the one that tells its outcome: a failure first,
    then a skip (the first world's skip ends a DeepSpeed-style test natively)."""
    return min(done, key=lambda d: _WORST_FIRST.get(d[1].outcome, 9))


def _per_class(notes: list[str]) -> list[str]:
    """One note per class and reason (``f.py::C::test_a: why`` -> ``f.py::C: why``)."""
    out: dict[str, None] = {}
    for note in notes:
        nodeid, _, why = note.partition(": ")
        head = nodeid.rsplit("::", 1)[0] if nodeid.count("::") >= 2 else nodeid
        out[f"{head}: {why}"] = None
    return list(out)
