"""The pytest session inside a rank: built once when the world starts, one test per cell.

The world file names :func:`prepare` (``WorldSpec.prepare``); each rank calls it before
its first cell and before the isolation baseline is taken, so the session, the modules it
imported and the ``sys.path`` it set are every cell's starting state. It re-creates the
pytest session the tests were collected in (:class:`.session_spec.PytestSession`:
the same command line, from the same folder, with the same ``sys.path``), minus what
cannot apply in a rank (reporting, selection, the cache, timeouts and crash handling that
cpmatrix owns), and collects the files of the tests this rank will run.

Each pytest cell then runs :func:`case`: the test by its node id through pytest's own
protocol (``pytest_runtest_protocol``: fixtures, markers, skip, xfail, unittest, subtests,
warnings), with the next test this rank runs as ``nextitem`` (so module and session
fixtures live as long as pytest would keep them). Every report is written, as pytest
serializes it for pytest-xdist, to ``<cell folder>/rank<R>/pytest.json`` right after it
is made, with its classification (:class:`~cpmatrix.kinds.pytest.verdict.RankPhase`): a
rank that dies mid-test leaves the phases it finished. The case raises when the test
failed on this rank (failed, or failed as expected): the world then stops waiting for the
other ranks after its grace period, as MultiProcessTestCase does.

Imports the standard library and cpmatrix's worker side at import time; pytest and torch
when a world starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cpmatrix.cell import CellContext
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.kinds.pytest.records import REPORTS_FILE
from cpmatrix.kinds.pytest.session_spec import KIND, PytestSession
from cpmatrix.worker.protocol import CellSpec, PytestSpec, WorldFolder, WorldSpec

__all__ = ["REPORTS_FILE", "PytestFailure", "SessionError", "before_fork", "case", "current_cell",
           "pinned_args", "prepare"]

#: Added to the rank's command line: pytest-timeout must not act in a rank (cpmatrix
#: owns timeouts: a hang is cut with every rank's stack), and output goes to the rank's
#: log as it is written (a crash or hang keeps what the test printed).
RANK_ARGS = ("-p", "no:timeout", "--capture=no")
#: pytest-timeout's own options, dropped from the rank's command line with the plugin.
_TIMEOUT_OPTIONS = ("--timeout", "--timeout_method", "--timeout-method", "--session-timeout",
                    "--timeout-disable-debugger-detection", "--timeout_func_only",
                    "--timeout-func-only")
#: Options reset after parsing: reporting, selection and stopping are the controller's;
#: the cache plugins stay loaded (their options may be on the command line) but idle.
_RESET: dict[str, Any] = {
    "cpmatrix": False, "xmlpath": None, "maxfail": 0, "keyword": "", "markexpr": "",
    "deselect": [], "usepdb": False, "trace": False, "lf": False, "failedfirst": False,
    "newfirst": False, "stepwise": False, "stepwise_skip": False, "durations": None,
    "collectonly": False, "looponfail": False, "numprocesses": None, "dist": "no",
    "cacheclear": False,
}


def rank_args(args: Sequence[str]) -> list[str]:
    """The session's command line as a rank runs it (:data:`RANK_ARGS` added,
    pytest-timeout's options dropped).

    >>> rank_args(["tests", "--timeout", "5", "--timeout=7", "-x"])
    ['tests', '-x', '-p', 'no:timeout', '--capture=no']
    """
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.partition("=")[0]
        if name in _TIMEOUT_OPTIONS:
            flag = name == "--timeout-disable-debugger-detection" or name.endswith("func_only") \
                or name.endswith("func-only")
            skip = "=" not in arg and not flag
            continue
        out.append(arg)
    return [*out, *RANK_ARGS]

def pinned_args(spec: PytestSession) -> list[str]:
    """The rank's command line (:func:`rank_args`) with the collecting session's rootdir
    and inifile pinned: the rank's session finds what the controller's found.

    >>> pinned_args(PytestSession(dir="/r", args=("t",), rootdir="/r", inifile="/r/p.ini"))
    ['t', '-p', 'no:timeout', '--capture=no', '--rootdir=/r', '-c', '/r/p.ini']
    """
    out = [*rank_args(spec.args), f"--rootdir={spec.rootdir}"]
    if spec.inifile:
        out += ["-c", spec.inifile]
    return out


_SESSION: _RankSession | None = None
_CELL: CellContext | None = None


class PytestFailure(Exception):
    """The test failed on this rank (its reports tell how)."""

    check = "pytest"


class SessionError(Exception):
    """The rank's pytest session could not run the test (collection, setup)."""

    check = "pytest_session"


def current_cell() -> CellContext | None:
    """The cell running now in this rank (the ``cell`` fixture), None outside one."""
    return _CELL


def before_fork(world: WorldSpec, installed: Callable[[str], bool]) -> list[str]:
    """In the fork launcher, before the ranks exist: import the installed modules the
    world's test files import, once for every rank (:mod:`cpmatrix.kinds.pytest.preload`);
    ``installed(path)`` tells an installed file. The names imported."""
    from cpmatrix.kinds.pytest.preload import preload

    tests = [_test_of(c) for c in world.cells if c.kind == KIND]
    if not tests:
        return []
    spec = PytestSession.from_json(tests[0].session)
    files = _test_files(spec, (t.nodeid for t in tests))
    return preload(files, spec.rootdir, [p for p in spec.sys_path if p], installed,
                   cwd=spec.dir, args=spec.args)


def _test_of(cell: CellSpec) -> PytestSpec:
    """The test a pytest cell runs (``CellSpec.from_cell`` always fills it)."""
    if cell.pytest is None:
        raise SessionError(f"{cell.id}: a pytest cell without its test in the world file")
    return cell.pytest


def _test_files(spec: PytestSession, nodeids: Iterable[str]) -> list[str]:
    """The files of ``nodeids``, once each, in order, as paths under the rootdir."""
    root = Path(spec.rootdir)
    return list(dict.fromkeys(str(root / n.split("::", 1)[0]) for n in nodeids))


def prepare(world: WorldSpec, rank: int) -> None:
    """Build this rank's pytest session for the world's pytest cells (never raises)."""
    global _SESSION
    mine = [c for i, c in enumerate(world.cells) if rank in world.ranks_of(i)
            and c.kind == KIND]
    if not mine:
        return
    _SESSION = _RankSession(world, rank, mine)
    _SESSION.start()


def case(cell: CellContext) -> None:
    """Run the cell's test in this rank's pytest session (a pytest cell's case)."""
    global _CELL
    state = _SESSION
    if state is None:
        raise SessionError("no pytest session in this rank (the world file names no "
                           "prepare step for its pytest cells)")
    if state.error:
        raise SessionError(f"the rank's pytest session did not start:\n{state.error}")
    test = state.tests.get(cell.id)
    if test is None:
        raise SessionError(f"{cell.id}: not one of this rank's pytest cells")
    nodeid = test.nodeid
    item = state.items.get(nodeid)
    if item is None:
        errors = "\n".join(state.collect_errors) or "(no collection error was reported)"
        raise SessionError(f"{nodeid}: not collected in the rank's pytest session "
                           f"(the controller collected it):\n{errors}")
    from cpmatrix.kinds.pytest.rank_dialects import dialect_of

    _CELL = cell
    try:
        phases = state.run(item, state.next_item(cell.id), cell,
                           dialect_of(test.dialect))
    finally:
        _CELL = None
    _tell_peers(phases)
    failed = [p for p in phases if p["kind"] in ("failed", "xfailed")]
    if state.plugin.last_exit is not None:
        raise PytestFailure(f"pytest.exit() on rank {cell.rank}: {state.plugin.last_exit}")
    if failed:
        p = failed[0]
        # One line: the report says the rest (and the log cuts this block on that line).
        first = next(iter(str(p["summary"]).splitlines()), "")
        raise PytestFailure(f"{p['kind']} in {p['when']} on rank {cell.rank}: {first}")


#: How long a rank whose test skipped waits for its peers to end the test before it
#: cuts them off: a skip every rank agrees on ends on each within moments, and a cut
#: costs the next test a new group. (A peer cut off is one waiting in a collective the
#: skipping rank never joins: natively a hang; the wait changes only the cost.)
SKIP_WAIT_S = 1.0


def _tell_peers(phases: list[dict[str, Any]]) -> None:
    """After this rank's test: say so, and cut the cell when it failed or skipped here
    (its peers may wait in a collective it will never join: worker/sever.py)."""
    from cpmatrix.worker import sever

    if sever.armed() is None:
        return
    sever.done()
    kinds = {p["kind"] for p in phases}
    if kinds & {"failed", "xfailed"} or ("skipped" in kinds
                                         and not sever.peers_done(SKIP_WAIT_S)):
        sever.cut_peers()


class _RankSession:
    """This rank's pytest config, session and collected items."""

    def __init__(self, world: WorldSpec, rank: int, cells: list[CellSpec]) -> None:
        self.world = world
        self.rank = rank
        #: Cell ids in the order this rank runs them, and each one's test.
        self.tests = {c.id: _test_of(c) for c in cells}
        self.spec = PytestSession.from_json(next(iter(self.tests.values())).session)
        self.by_cell = {cell_id: t.nodeid for cell_id, t in self.tests.items()}
        self.order = list(self.by_cell)
        self._position = {cell_id: i for i, cell_id in enumerate(self.order)}
        self.deepspeed = {t.nodeid for t in self.tests.values() if t.dialect == "deepspeed"}
        self.items: dict[str, Any] = {}
        self.collect_errors: list[str] = []
        self.error = ""
        self.config: Any = None
        self.plugin = _RankPlugin()

    def start(self) -> None:
        try:
            self._start()
        except BaseException as exc:  # an error here is each cell's to report
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.error = traceback.format_exc()
            print(f"cpmatrix pytest front: rank {self.rank}: the pytest session did not "
                  f"start:\n{self.error}", file=sys.stderr, flush=True)

    def _start(self) -> None:
        from _pytest.config import _prepareconfig

        import pytest
        from cpmatrix.kinds.pytest.rank_dialects import step_aside_launchers

        os.chdir(self.spec.dir)
        # The collecting process's sys.path first (pytest imported the tests from there),
        # then what the rank has besides.
        known = [p for p in self.spec.sys_path if p]
        sys.path[:] = [*known, *(p for p in sys.path if p not in known)]
        config = _prepareconfig(pinned_args(self.spec), plugins=[self.plugin])
        for name, value in _RESET.items():
            if hasattr(config.option, name):
                setattr(config.option, name, value)
        basetemp = WorldFolder(Path(self.world.dir)).pytest_tmp(self.rank)
        # pytest makes the basetemp itself (emptied first), but not the folders above it.
        basetemp.parent.mkdir(parents=True, exist_ok=True)
        config.option.basetemp = str(basetemp)
        config._do_configure()
        self.config = config
        session = pytest.Session.from_config(config)
        session.exitstatus = 0
        config.hook.pytest_sessionstart(session=session)
        items = session.perform_collect(_test_files(self.spec, self.by_cell.values()),
                                        genitems=True)
        self.collect_errors = list(self.plugin.collect_errors)
        wanted = set(self.by_cell.values())
        self.items = {i.nodeid: i for i in items if i.nodeid in wanted}
        step_aside_launchers(config, self.items.values(), self.deepspeed)

    def next_item(self, cell_id: str) -> Any:
        """The test this rank runs after ``cell_id``'s (None after its last one)."""
        i = self._position.get(cell_id)
        if i is None:
            return None
        for later in self.order[i + 1:]:
            item = self.items.get(self.by_cell[later])
            if item is not None:
                return item
        return None

    def run(self, item: Any, nextitem: Any, cell: CellContext,
            dialect: Any) -> list[dict[str, Any]]:
        """Run ``item`` once; its classified phases (also written to the cell's folder)."""
        import pytest
        from cpmatrix.kinds.pytest.rank_dialects import in_test

        out = Path(cell.out_dir) / REPORTS_FILE
        self.plugin.begin(item.nodeid, cell.rank, cell.world_size, out, self.config)
        try:
            with in_test(item, cell, dialect, workdir=self.spec.dir):
                item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        except pytest.exit.Exception as exc:
            # Natively it ends the pytest process it ran in (a fixture, a setUp, a
            # DeepSpeed test: the session): the controller ends its session with it.
            # This rank's session survives it: the test's fixtures and nodes torn down,
            # so the next test sets up as after a finished one.
            self.plugin.exited(exc)
            with contextlib.suppress(Exception):
                item.session._setupstate.teardown_exact(None)
        finally:
            phases = self.plugin.end()
        return phases


class _RankPlugin:
    """Collects the reports and warnings of the test running now, and collection errors."""

    def __init__(self) -> None:
        self.collect_errors: list[str] = []
        self.record: dict[str, Any] | None = None
        self.out: Path | None = None
        self.config: Any = None
        #: The first failed subtest report of each phase of the test running now.
        self._subfailed: dict[str, Any] = {}
        #: The message of the ``pytest.exit()`` the test running now called, if any.
        self.last_exit: str | None = None

    def begin(self, nodeid: str, rank: int, size: int, out: Path, config: Any) -> None:
        self.config = config
        self.out = out
        self.record = {"nodeid": nodeid, "rank": rank, "size": size, "phases": [],
                       "reports": [], "warnings": [], "cut_off": []}
        self._subfailed = {}
        self.last_exit = None
        self._write()

    def exited(self, exc: Any) -> None:
        """The test called ``pytest.exit()`` where it ends the session natively."""
        self.last_exit = str(exc.msg)
        if self.record is not None:
            self.record["exit"] = {"msg": str(exc.msg), "returncode": exc.returncode}
            self._write()

    def end(self) -> list[dict[str, Any]]:
        record, self.record = self.record, None
        self._write(record)
        return list(record["phases"]) if record else []

    def _write(self, record: dict[str, Any] | None = None) -> None:
        record = record if record is not None else self.record
        if record is not None and self.out is not None:
            atomic_write_json(self.out, record)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collect_errors.append(f"{report.nodeid or '<session>'}: {report.longreprtext}")

    def pytest_runtest_logreport(self, report: Any) -> None:
        if self.record is None or report.nodeid != self.record["nodeid"]:
            return
        data = self.config.hook.pytest_report_to_serializable(config=self.config,
                                                              report=report)
        reports = self.record["reports"]
        if type(report).__name__ != "TestReport":
            # A subtest's report: replayed by the controller, never a phase of its own;
            # a failed one fails its phase (a spawned torch worker runs the method
            # bare: a failing ``subTest`` fails the test there).
            if report.failed:
                self._subfailed.setdefault(report.when, report)
            reports.append(_jsonable(data))
            self._write()
            return
        phase = _classify(report, len(reports))
        if report.failed and _cut_off(report):
            # A peer failed or skipped and cut the cell while this rank waited for it in
            # a collective: not this rank's verdict of the phase (natively it is ended).
            self.record["cut_off"].append({"when": report.when, "summary": phase["summary"],
                                           "index": phase["index"]})
            reports.append(_jsonable(data))
            self._write()
            return
        sub = self._subfailed.get(report.when)
        if sub is not None and phase["kind"] == "passed":
            phase.update(kind="failed", summary=f"a subtest failed: {_crash_line(sub)}",
                         text=sub.longreprtext or "")
        self.record["phases"].append(phase)
        reports.append(_jsonable(data))
        self._write()

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str,
                                location: Any) -> None:
        if self.record is None:
            return
        self.record["warnings"].append({
            "message": str(warning_message.message),
            "category": type(warning_message.message).__name__
            if isinstance(warning_message.message, Warning)
            else getattr(warning_message.category, "__name__", "UserWarning"),
            "filename": str(warning_message.filename), "lineno": warning_message.lineno,
            "when": when, "nodeid": nodeid})
        self._write()


def _cut_off(report: Any) -> bool:
    """Whether a failed report is the error of a collective a peer cut."""
    from cpmatrix.worker import sever

    return sever.CUT_OFF.search(report.longreprtext or "") is not None and sever.cut_by_peer()


def _classify(report: Any, index: int) -> dict[str, Any]:
    """A report as a :class:`~cpmatrix.kinds.pytest.verdict.RankPhase` (a dict)."""
    text = report.longreprtext or ""
    wasxfail = hasattr(report, "wasxfail")
    kind = report.outcome
    if report.outcome == "skipped" and wasxfail:
        kind = "xfailed"
    elif report.outcome == "passed" and wasxfail:
        kind = "xpassed"
    elif report.outcome == "failed" and (text.startswith("[XPASS(strict)]")
                                         or text.strip().startswith("Unexpected success")):
        kind = "xpassed"  # strict xfail, or unittest's expectedFailure, that passed
    if kind in ("skipped", "xfailed"):
        summary = _skip_reason(report)
    elif kind == "failed":
        lines = text.strip().splitlines()
        summary = _crash_line(report) or (lines[-1] if lines else "failed")
    else:
        summary = str(getattr(report, "wasxfail", "") or "")
    return {"when": report.when, "outcome": report.outcome, "kind": kind,
            "summary": summary, "text": text, "duration": float(report.duration),
            "index": index}


def _skip_reason(report: Any) -> str:
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail) or "xfail"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "skipped")


def _crash_line(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    return str(getattr(crash, "message", "") or "").splitlines()[0] if crash else ""


def _jsonable(data: Any) -> Any:
    """What pytest serialized, as plain JSON (a plugin may add odd values)."""
    return json.loads(json.dumps(data, default=str))
