"""``--json`` of ``run``, ``gate``, ``show`` and ``merge``: one document on stdout.

Each document is an object with ``schema_version`` (1), ``command``, ``exit_code`` and
``errors`` (what the command said on stderr), then the command's own fields; the JSON
Schema is ``cpmatrix/cli/cli-json.schema.json`` (:data:`SCHEMA_PATH`), documented in
docs/cli-json.md. The human output goes to stderr (``run``) or is left out, so stdout
holds exactly one document, whatever the exit code. A command that stopped before its
work (exit 2, or a signal, or an internal error) gives the *error document*
(:func:`error_doc`), made in one place, ``cpmatrix.cli.main``; a command's own document
is made by its handler, once.

Example::

    >>> doc = error_doc("run", 2, "no matrix")
    >>> doc["command"], doc["exit_code"], doc["errors"]
    ('run', 2, ['no matrix'])
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from cpmatrix.layout import RunLayout
from cpmatrix.result import Result, Status, target_of, testcase_name

__all__ = ["JSON_COMMANDS", "SCHEMA_PATH", "SCHEMA_VERSION", "cell_row", "emit", "emitted",
           "error_doc", "gate_doc", "merge_doc", "run_doc", "show_doc"]

SCHEMA_VERSION: Final = 1
#: The JSON Schema every document validates against.
SCHEMA_PATH: Final = Path(__file__).with_name("cli-json.schema.json")


#: The commands that take ``--json``.
JSON_COMMANDS: Final = ("run", "gate", "show", "merge")

#: How many documents this process printed (``main`` prints the error document only
#: where the command printed none).
_emitted: list[int] = [0]


def emit(doc: Mapping[str, Any]) -> None:
    """Print ``doc`` as the one JSON document on stdout."""
    print(json.dumps(doc, indent=1, default=str), flush=True)
    _emitted[0] += 1


def emitted() -> int:
    """How many documents :func:`emit` has printed in this process."""
    return _emitted[0]


def _head(command: str, code: int, errors: Iterable[str]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "command": command, "exit_code": int(code),
            "errors": [e for e in errors if e]}


def error_doc(command: str, code: int, message: str) -> dict[str, Any]:
    """A command that stopped before its work (a usage or spec error: exit 2; a signal;
    an internal error): the shared fields, ``ok`` false and nothing else."""
    doc = _head(command, code, [message or "stopped"])
    doc["ok"] = False
    return doc


def cell_row(r: Result) -> dict[str, Any]:
    """One result as the documents list it."""
    return {
        "id": r.cell_id, "name": testcase_name(r.cell_id, r.mutant), "mutant": r.mutant,
        "status": r.status.value, "ok": r.status.ok,
        "kind": r.kind.value if r.kind else None, "failing_ranks": list(r.failing_ranks),
        "message": r.headline() if not r.status.ok and r.failures else r.message,
        "duration_s": round(r.duration_s, 4), "case_s": round(r.case_s, 4),
        "attempts": r.attempts, "out_dir": r.out_dir, "repro": r.repro or None,
        "evidence": {str(k): v for k, v in r.evidence.items()},
    }


def _targets(results: Iterable[Result]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        target = target_of(r.cell_id)
        row = rows.setdefault(target, {"target": target, "cells": 0, "passed": 0,
                                       "failed": 0, "skipped": 0, "time_s": 0.0})
        row["cells"] += 1
        row["passed" if r.status.ok else "skipped" if r.status is Status.SKIPPED
            else "failed"] += 1
        row["time_s"] = round(row["time_s"] + r.duration_s, 4)
    return list(rows.values())


def run_doc(code: int, report: Any, out: Path, errors: Sequence[str]) -> dict[str, Any]:
    """``run --json``: where the report is, the counts, a row per target and per cell
    (``report`` None: the run ran nothing, e.g. exit 3)."""
    doc = _head("run", code, errors)
    results: list[Result] = list(report.results.values()) if report is not None else []
    layout = RunLayout(out)
    doc.update({
        "ok": code == 0, "out": str(out),
        "report": str(layout.report_xml) if report is not None else None,
        "html": str(layout.report_html) if report is not None else None,
        "wall_s": round(report.wall_s, 3) if report is not None else None,
        "counts": dict(report.counts()) if report is not None else {},
        "targets": _targets(results),
        "cells": [cell_row(r) for r in results],
    })
    return doc


def gate_doc(code: int, result: Any, errors: Sequence[str]) -> dict[str, Any]:
    """``gate --json``: the verdict, the required cells and every reason."""
    doc = _head("gate", code, errors)
    doc.update({
        "ok": bool(result.ok), "policy": result.policy.name, "required": result.required,
        "counts": {str(k): int(v) for k, v in result.counts.items()},
        "presence": result.presence or None, "sources_checked": result.sources_checked,
        "mutants": {"runs": result.mutant_runs, "killed": result.mutants_killed},
        "drift_compared": result.drift_compared,
        "reasons": [{"check": r.check, "cell": r.cell, "detail": r.detail}
                    for r in result.reasons],
    })
    return doc


def show_doc(code: int, cell: Mapping[str, Any] | None, result: Result | None,
             results_file: Path | None, errors: Sequence[str],
             history: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``show --json``: the cell's definition and its last result (None when the
    folder holds none, or the cell is not in the matrix: exit 3); with ``--history``, its
    recorded runs instead."""
    doc = _head("show", code, errors)
    doc.update({"ok": code == 0, "cell": dict(cell) if cell is not None else None,
                "result": cell_row(result) if result is not None else None,
                "results_file": str(results_file) if results_file else None,
                "history": dict(history) if history is not None else None})
    return doc


def merge_doc(code: int, out: Path, folders: Sequence[Path], summary: Any,
              not_passed: int, errors: Sequence[str]) -> dict[str, Any]:
    """``merge --json``: the merged folder and what the merge found."""
    doc = _head("merge", code, errors)
    doc.update({
        "ok": code == 0, "out": str(out), "folders": [str(f) for f in folders],
        "cells": summary.cells, "not_passed": not_passed, "missing": list(summary.missing),
        "conflicts": list(summary.conflicts), "duplicates": list(summary.duplicates),
        "warnings": list(summary.warnings),
    })
    return doc
