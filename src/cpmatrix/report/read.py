"""Reading a merged ``report.xml`` back: one :class:`ReportCell` per testcase.

Shared by the gate and the HTML report. Accepts what ``cpmatrix run`` writes and, for the
parts it can, plain JUnit from other tools (no properties: the status comes from the
failure/skipped elements, the axes from the cell id).

Example::

    >>> cells = read_report("out/report.xml")                 # doctest: +SKIP
    >>> [c.name for c in cells if not c.status.ok]            # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from junitparser import Error, Failure, JUnitXml, JUnitXmlError, Properties, Skipped

from cpmatrix.matrix.cellid import parse_cell_id
from cpmatrix.result import Status, split_testcase_name, target_of

__all__ = ["ReportCell", "ReportError", "read_report"]


class ReportError(Exception):
    """A report that cannot be read or is not a cpmatrix JUnit report (exit 2)."""


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportCell:
    """One testcase of a merged report: a cell, or one mutant run of a cell.

    >>> c = ReportCell(name="t[unit,1x1,fp64,autocast=off,reference]@cpu!mutant=m",
    ...                status=Status.PASSED, properties={"tags": "release,fast"})
    >>> c.cell_id, c.mutant, c.tags, c.platform
    ('t[unit,1x1,fp64,autocast=off,reference]@cpu', 'm', ('release', 'fast'), 'cpu')
    """

    name: str
    status: Status
    properties: Mapping[str, str]
    #: The failure element's text (tracebacks, log tails) or, for FLAKY, the system-out.
    text: str = ""
    #: The failure or skip element's one-line message (``Result.headline()``).
    headline: str = ""
    time: float = 0.0

    @property
    def cell_id(self) -> str:
        return self.properties.get("cell_id") or split_testcase_name(self.name)[0]

    @property
    def mutant(self) -> str:
        return self.properties.get("mutant") or split_testcase_name(self.name)[1]

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(t for t in self.properties.get("tags", "").split(",") if t)

    def axis(self, key: str) -> str:
        """An axis (``target``, ``platform``, ``mesh``, ...) from the properties or the id.

        Synthetic or foreign reports may carry only the name; a spill cell's id may not
        parse as a parity id, which leaves the axis empty.
        """
        value = self.properties.get(key)
        if value is not None:
            return value
        try:
            parsed = parse_cell_id(self.cell_id)
        except ValueError:
            return target_of(self.cell_id) if key == "target" else ""
        if key == "autocast":
            return "on" if parsed.autocast else "off"
        if key == "params":
            return ",".join(f"{k}={v}" for k, v in parsed.params)
        return str(getattr(parsed, key, ""))

    @property
    def platform(self) -> str:
        return self.axis("platform")

    @property
    def evidence(self) -> dict[str, str]:
        """``evidence.*`` properties without the prefix."""
        return {k[len("evidence."):]: v for k, v in self.properties.items()
                if k.startswith("evidence.")}


def _status_of(name: str, props: Mapping[str, str], results: Sequence[Any], where: str) -> Status:
    """The testcase's status: its result elements win over its ``status`` property.

    A ``<failure>``/``<error>`` element always means failed, whatever the property says
    (a hand-edited or foreign report could otherwise carry a failure marked passed); a
    ``<skipped>`` element turns a "passed" property into skipped.
    """
    raw = props.get("status")
    status: Status | None = None
    if raw is not None:
        try:
            status = Status(raw)
        except ValueError:
            allowed = ", ".join(s.value for s in Status)
            raise ReportError(f"{where}: testcase {name!r}: unknown status {raw!r} "
                              f"(allowed: {allowed})") from None
    if any(isinstance(r, Failure | Error) for r in results):
        if status in (Status.FAILED, Status.TIMEOUT, Status.CRASH, Status.INFRA,
                      Status.SURVIVED):
            return status
        return Status.FAILED
    if any(isinstance(r, Skipped) for r in results) and (status is None or status.ok):
        return Status.SKIPPED
    return Status.PASSED if status is None else status


def _properties_of(case: Any) -> dict[str, str]:
    # ``Any``: junitparser's ``child`` is untyped.
    elem = case.child(Properties)
    return {p.name: p.value or "" for p in elem} if elem is not None else {}


def read_report(path: str | os.PathLike[str]) -> list[ReportCell]:
    """Every testcase of a JUnit report written by ``cpmatrix run``.

    Raises :class:`ReportError` (one line: the file and what is wrong) for a missing or
    unreadable file, XML that is not JUnit, a testcase without a name, an unknown status
    or a testcase that appears twice.
    """
    where = os.fspath(path)
    try:
        xml = JUnitXml.fromfile(where)
    except FileNotFoundError:
        raise ReportError(f"{where}: no such report") from None
    except (OSError, SyntaxError, JUnitXmlError) as exc:  # ParseError is a SyntaxError
        raise ReportError(f"{where}: not a JUnit XML report ({exc})") from None
    cells: list[ReportCell] = []
    seen: set[str] = set()
    for suite in xml:
        for case in suite:
            if not case.name:
                raise ReportError(f"{where}: a testcase in suite {suite.name!r} has no name")
            if case.name in seen:
                raise ReportError(f"{where}: testcase {case.name!r} appears twice (each cell "
                                  "must appear once; was the report concatenated by hand?)")
            seen.add(case.name)
            props = _properties_of(case)
            results = list(case.result)
            text = "\n".join(r.text or "" for r in results if r.text) or (case.system_out or "")
            cells.append(ReportCell(
                name=case.name, status=_status_of(case.name, props, results, where),
                properties=props, text=text, time=float(case.time or 0.0),
                headline=next((r.message for r in results if r.message), ""),
            ))
    return cells
