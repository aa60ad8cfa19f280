"""JUnit XML: one file per world, merged with junitparser into ``report.xml``.

One testsuite per target, one testcase per planned cell (name = cell id), with the
numeric evidence and the cell's axes as ``<properties>`` on the testcase (the form
pytest's ``record_property`` uses, which CI test-report readers show).

Example::

    >>> xml = results_to_junit([], {})      # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence

from junitparser import Error, Failure, JUnitXml, Properties, Property, Skipped, TestCase, TestSuite

from cpmatrix.fsutil import atomic_write_bytes
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.schema import Cell
from cpmatrix.result import Result, Status, target_of, testcase_name

__all__ = ["merge_junit", "results_to_junit", "write_run_junit", "write_suites",
           "xml_safe"]

_TEXT_LIMIT = 20_000
#: Terminal colour and cursor codes (CSI sequences): noise in a report, so dropped.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: What XML 1.0 cannot hold at all (C0 controls but tab/newline/CR, lone surrogates,
#: U+FFFE/U+FFFF). Its parsers refuse such a document outright.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """``text`` as XML 1.0 can hold it, still readable.

    Colour codes are dropped; any other character XML cannot hold is spelled out as
    ``\\xNN`` or ``\\uNNNN``. A case's log line, evidence or exception message can hold
    anything: one such character must never cost the run its report.

    >>> xml_safe("\x1b[31mred\x1b[0m nul\x00")
    'red nul\\x00'
    """
    text = _ANSI.sub("", text)
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)


def _clip(text: str) -> str:
    text = xml_safe(text)
    return text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + "\n... (clipped)"


def _properties(cell: Cell | None, result: Result) -> list[tuple[str, str]]:
    props: list[tuple[str, str]] = [("cell_id", result.cell_id)]
    if cell is not None:
        props += [
            ("digest", cell.digest),
            ("target", cell.target),
            ("platform", cell.platform),
            ("mesh", str(cell.mesh)),
            ("world_size", str(cell.world_size)),
            ("dtype", cell.dtype),
            ("autocast", "on" if cell.autocast else "off"),
            ("path", cell.path),
            ("level", cell.level),
            ("params", ",".join(f"{k}={v}" for k, v in cell.params)),
            ("tags", ",".join(cell.tags)),
        ]
    props += [
        ("status", result.status.value),
        ("duration", f"{result.duration_s:.3f}"),
        ("case_time", f"{result.case_s:.3f}"),
        ("attempts", str(result.attempts)),
    ]
    if result.kind is not None:
        props.append(("kind", result.kind.value))
    if result.failing_ranks:
        props.append(("failing_ranks", ",".join(map(str, result.failing_ranks))))
    if result.mutant:
        props.append(("mutant", result.mutant))
    if result.runs:  # --runs-per-test N: the counts, and what each failing run said
        props += [("runs", str(result.runs)), ("runs_passed", str(result.runs_passed)),
                  ("runs_failed", str(result.runs - result.runs_passed))]
        if result.run_statuses:  # what the gate re-applies the rule of repeated runs to
            props.append(("run_statuses", ",".join(s.value for s in result.run_statuses)))
        props += [(f"run_failure.{i}", line[:500])
                  for i, line in enumerate(result.run_failures, 1)]
    if result.message:
        props.append(("message", result.message[:500]))
    if result.repro:  # the line that reruns the cell alone, to paste into a shell
        props.append(("repro", result.repro))
    # What the result was computed from: the gate checks source.digest against the
    # matrix, a merge compares them between folders.
    for key, value in result.source.items():
        props.append((f"source.{key}", value))
    for key, value in result.evidence.items():
        props.append((f"evidence.{key}", str(value)))
    return props


def _failure_text(result: Result) -> str:
    parts: list[str] = []
    if result.repro:
        parts.append(f"repro: {result.repro}")
    if result.message:
        parts.append(result.message)
    parts += [f"--- {line}" for line in result.run_failures]
    for f in result.failures:
        check = f" [check: {f.check}]" if f.check else ""
        parts.append(f"--- rank {f.rank}: {f.message}{check}")
        if f.traceback:
            parts.append(f.traceback.rstrip())
    for rank, tail in sorted(result.stderr_tails.items()):
        if tail.strip():
            parts.append(f"--- rank {rank} log (last lines)\n{tail.rstrip()}")
    return _clip("\n".join(parts))


def _testcase(cell: Cell | None, result: Result) -> TestCase:
    target = cell.target if cell else target_of(result.cell_id)
    tc = TestCase(xml_safe(testcase_name(result.cell_id, result.mutant)),
                  classname=xml_safe(target), time=round(result.duration_s, 3))
    props = Properties()
    for name, value in _properties(cell, result):
        props.append(Property(xml_safe(name), xml_safe(value)))
    tc.append(props)
    if result.status in (Status.PASSED, Status.CACHED, Status.FLAKY, Status.KILLED):
        if result.status is Status.FLAKY:
            tc.system_out = _clip(f"FLAKY: {result.message}\n{_failure_text(result)}")
        if result.status is Status.KILLED:  # the message says by what; the ranks it failed
            tc.system_out = _clip(f"KILLED: {result.message}\n{_failure_text(result)}")
        return tc
    if result.status in (Status.SKIPPED, Status.INTERRUPTED, Status.NOT_JUDGED):
        tc.result = [Skipped(xml_safe(result.message))]
        return tc
    head = xml_safe(result.headline())
    if result.status is Status.SURVIVED:
        elem: Failure | Error = Failure(head[:300], "survived")
    elif result.kind is not None and result.kind.value == "error":
        elem = Failure(head[:300], xml_safe(
            result.first_failure.message.split(":")[0]) if result.first_failure else "error")
    else:
        elem = Error(head[:300], result.status.value)
    elem.text = _failure_text(result)
    tc.result = [elem]
    return tc


def results_to_junit(results: Iterable[Result], cells: Mapping[str, Cell],
                     suite_name: str = "cpmatrix") -> JUnitXml:
    """Build a JUnitXml with one testsuite per target."""
    suites: dict[str, TestSuite] = {}
    for r in results:
        cell = cells.get(r.cell_id)
        target = cell.target if cell else target_of(r.cell_id)
        suite = suites.get(target)
        if suite is None:
            suite = suites[target] = TestSuite(target)
        suite.add_testcase(_testcase(cell, r))
    xml = JUnitXml(suite_name)
    for suite in suites.values():
        suite.update_statistics()
        xml.add_testsuite(suite)
    xml.update_statistics()
    return xml


def write_junit(path: str | os.PathLike[str], xml: JUnitXml) -> None:
    data = xml.tostring()
    atomic_write_bytes(path, data if isinstance(data, bytes) else data.encode())


def merge_junit(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                run_id: str = "", properties: Mapping[str, str] | None = None) -> JUnitXml:
    """Merge world files into one report, regrouping testcases into one suite per target.

    ``run_id`` is stamped on every suite (property ``cpmatrix.run_id``): which run wrote
    the report, for tools that must not mix reports of different runs; ``properties``
    too (``cpmatrix.order``: the ``--order`` a run used).
    """
    suites: dict[str, TestSuite] = {}
    for path in paths:
        for suite in JUnitXml.fromfile(os.fspath(path)):
            for case in suite:
                target = case.classname or suite.name
                dest = suites.get(target)
                if dest is None:
                    dest = suites[target] = TestSuite(target)
                dest.add_testcase(case)
    return write_suites(suites, out, run_id=run_id, properties=properties)


def write_suites(suites: Mapping[str, TestSuite], out: str | os.PathLike[str],
                 run_id: str = "", properties: Mapping[str, str] | None = None) -> JUnitXml:
    """One report of ``suites`` (target -> suite, sorted by target), stamped ``run_id``
    (and ``properties``)."""
    xml = JUnitXml("cpmatrix")
    for name in sorted(suites):
        suites[name].update_statistics()
        if run_id:
            suites[name].add_property("cpmatrix.run_id", run_id)
        for key, value in (properties or {}).items():
            suites[name].add_property(xml_safe(key), xml_safe(value))
        xml.add_testsuite(suites[name])
    xml.update_statistics()
    write_junit(out, xml)
    return xml


def write_run_junit(layout: RunLayout, batches: Mapping[str, Sequence[Result]],
                    cells: Mapping[str, Cell], run_id: str = "",
                    properties: Mapping[str, str] | None = None) -> None:
    """A run's junit files: one per batch (``layout.world_junit(batch)``), merged into
    ``layout.report_xml``."""
    files = []
    for batch, results in batches.items():
        path = layout.world_junit(batch)
        write_junit(path, results_to_junit(results, cells, batch))
        files.append(path)
    merge_junit(files, layout.report_xml, run_id=run_id, properties=properties)
