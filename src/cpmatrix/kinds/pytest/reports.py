"""A judged multi-rank test as pytest's own reports, for pytest's own hooks.

For each phase of the :class:`~cpmatrix.kinds.pytest.verdict.Verdict`: the standing
rank's report itself, as that rank's pytest made it (deserialized with pytest's
``pytest_report_from_serializable``: its long representation, ``wasxfail``, user
properties), or a report made from the verdict's text (a crash, a hang, a skip not agreed).
Every rank's captured sections are added, each title marked with its rank; a failed
test also gets each rank's log during the test. So ``--junitxml``, ``-rA``, ``--durations``
and ``--lf`` see an ordinary test.

Example (in the controller)::

    for report in reports_for(item, verdict, records, result, config):
        item.ihook.pytest_runtest_logreport(report=report)
"""

from __future__ import annotations

import builtins
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cpmatrix.kinds.pytest.verdict import PhaseVerdict, Verdict
from cpmatrix.layout import cell_stacks
from cpmatrix.module_names import PYTEST_RANK
from cpmatrix.result import FailureKind, Result

__all__ = ["LeftStateWarning", "replay_left_state", "replay_warnings", "reports_for",
           "subreports_for"]


class LeftStateWarning(UserWarning):
    """A test that did not fail left state behind in its ranks' process (replaced a
    function, kept a group, ...): its outcome stands, as natively; cpmatrix ran no later
    test in that process."""


def _made(item: Any, phase: PhaseVerdict) -> pytest.TestReport:
    return pytest.TestReport(
        nodeid=item.nodeid, location=item.location,
        keywords={k: 1 for k in item.keywords}, outcome=phase.outcome,  # type: ignore[arg-type]
        longrepr=phase.message if phase.outcome == "failed" else None,
        when=phase.when, sections=[], duration=phase.duration)  # type: ignore[arg-type]


def _name_the_rank(report: Any, phase: PhaseVerdict) -> None:
    """A failure's message names its rank and its note goes with its traceback, so
    ``--junitxml`` (whose default ``junit_logging = no`` drops report sections) says
    which ranks failed; other notes are a section of their own."""
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if report.failed and phase.rank is not None:
        if crash is not None:
            crash.message = f"[rank {phase.rank}] {crash.message}"
        elif isinstance(longrepr, str):
            report.longrepr = longrepr = f"[rank {phase.rank}] {longrepr}"
    if not phase.message:
        return
    if report.failed and hasattr(longrepr, "addsection"):
        longrepr.addsection("cpmatrix", phase.message)
    else:
        report.sections.append(("cpmatrix", phase.message))


def _phase_data(records: Mapping[int, Mapping[str, Any]], rank: int,
                when: str) -> dict[str, Any] | None:
    record = records.get(rank)
    if record is None:
        return None
    for p in record.get("phases", ()):
        if p.get("when") == when:
            index = int(p.get("index", -1))
            reports = record.get("reports", [])
            if 0 <= index < len(reports):
                return dict(reports[index])
    return None


def _sections(records: Mapping[int, Mapping[str, Any]], when: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for rank in sorted(records):
        data = _phase_data(records, rank, when)
        for title, content in (data or {}).get("sections", ()):
            out.append((f"{title} [rank {rank}]", str(content)))
    return out


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)
#: What cpmatrix's worker prints when a pytest case fails: the rank's reports say it better.
#: The traceback's frames are indented lines, so a traceback the test printed before it
#: (ending in its own exception line) is never swallowed with it. A SessionError stays:
#: no report says what it says.
_WORKER_BLOCK = re.compile(r"(?:cpmatrix worker: cell [^\n]* failed on rank \d+:\n)?"
                           r"Traceback \(most recent call last\):\n(?:[ \t][^\n]*\n)*?"
                           rf"{re.escape(PYTEST_RANK)}\.PytestFailure: [^\n]*\n?")


def _where(stacks: str, test_file: str) -> str:
    """Where a rank's dumped stack is in the test's own file (the frame nearest the
    hang), e.g. ``faults/test_x.py:27 in test_hang``; "" when it is not."""
    current = stacks.split("Current thread", 1)
    text = current[1] if len(current) > 1 else stacks
    for m in _FRAME.finditer(text):
        if os.path.realpath(m.group("file")) == test_file:
            return f"{os.path.basename(test_file)}:{m.group('line')} in {m.group('func')}"
    return ""


def _stacks(cell_dir: Path | None, size: int) -> dict[int, str]:
    out: dict[int, str] = {}
    if cell_dir is None:
        return out
    for r in range(size):
        try:
            text = Path(cell_stacks(str(cell_dir), r)).read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            out[r] = text
    return out


def reports_for(item: Any, verdict: Verdict, records: Mapping[int, Mapping[str, Any]],
                result: Result, config: Any, *, cell_dir: Path | None = None,
                size: int = 0) -> list[Any]:
    """The reports to log for ``item``, phase by phase (``cell_dir``: the cell's folder,
    where a hung test's ranks left their stacks)."""
    reports: list[Any] = []
    failed_at = next((p.when for p in verdict.phases if p.outcome == "failed"), None)
    stacks = _stacks(cell_dir, size) if result.kind is FailureKind.TIMEOUT else {}
    test_file = os.path.realpath(str(getattr(item, "path", "")))
    for phase in verdict.phases:
        data = _phase_data(records, phase.rank, phase.when) if phase.rank is not None else None
        if data is not None:
            report = config.hook.pytest_report_from_serializable(config=config, data=data)
            report.nodeid, report.location = item.nodeid, item.location
            if isinstance(report.longrepr, list):  # a skip's (path, line, reason), via JSON
                report.longrepr = tuple(report.longrepr)
            report.duration = phase.duration
            report.sections = []
            _name_the_rank(report, phase)
        else:
            report = _made(item, phase)
            if stacks and phase.outcome == "failed":
                where = [f"rank {r} was at {w}" for r, text in sorted(stacks.items())
                         if (w := _where(text, test_file))]
                if where:
                    report.longrepr = "\n".join([*where, str(report.longrepr)])
        report.sections.extend(_sections(records, phase.when))
        if phase.when == failed_at:
            for rank, text in sorted(stacks.items()):
                report.sections.append((f"Captured stacks rank {rank}", text))
            for rank, tail in sorted(result.stderr_tails.items()):
                tail = _WORKER_BLOCK.sub("", tail)
                if tail.strip():
                    title = "launcher log" if rank < 0 else f"rank {rank} log"
                    report.sections.append((f"Captured {title}", tail))
        reports.append(report)
    return reports


def subreports_for(verdict: Verdict, records: Mapping[int, Mapping[str, Any]],
                    config: Any) -> list[Any]:
    """The subtests' reports of the rank whose call report stands for the test."""
    call = next((p for p in verdict.phases if p.when == "call"), None)
    if call is None or call.rank is None or call.rank not in records:
        return []
    out = []
    for data in records[call.rank].get("reports", ()):
        if data.get("_report_type") == "SubTestReport":
            sub = config.hook.pytest_report_from_serializable(config=config, data=data)
            crash = getattr(sub.longrepr, "reprcrash", None)
            if sub.failed and crash is not None:
                crash.message = f"[rank {call.rank}] {crash.message}"
            out.append(sub)
    return out


def _category(name: str) -> type[Warning]:
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, Warning):
        return found
    return UserWarning


def replay_warnings(config: Any, item: Any, records: Mapping[int, Mapping[str, Any]],
                    seen: set[tuple[str, str, str, int]]) -> None:
    """Each warning the ranks recorded, once (the same warning on every rank is one)."""
    for rank in sorted(records):
        for w in records[rank].get("warnings", ()):
            key = (str(w.get("message")), str(w.get("category")), str(w.get("filename")),
                   int(w.get("lineno") or 0))
            if key in seen:
                continue
            seen.add(key)
            category = _category(key[1])
            text = key[0] if category.__name__ == key[1] else f"{key[1]}: {key[0]}"
            message = warnings.WarningMessage(category(text), category, key[2], key[3])
            config.hook.pytest_warning_recorded.call_historic(kwargs={
                "warning_message": message, "when": "runtest", "nodeid": item.nodeid,
                "location": None})


def replay_left_state(config: Any, item: Any, verdict: Verdict) -> None:
    """What the test left behind (:attr:`Verdict.left_state`), as a warning of the test."""
    if not verdict.left_state:
        return
    text = (f"cpmatrix: the test left state behind in its ranks' process (its outcome "
            f"stands; no later test ran there): {verdict.left_state}")
    message = warnings.WarningMessage(LeftStateWarning(text), LeftStateWarning,
                                      str(item.location[0]), int(item.location[1] or 0) + 1)
    config.hook.pytest_warning_recorded.call_historic(kwargs={
        "warning_message": message, "when": "runtest", "nodeid": item.nodeid,
        "location": None})
