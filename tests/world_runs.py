"""One real ``cpmatrix run`` as the world and e2e tests read it: folder, exit code,
output, rows, ``run.json``.

Several tests start one run (or a few) in a module-scoped fixture and check many things
in it; they share this holder instead of each writing its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Run", "read_run"]


@dataclass(frozen=True)
class Run:
    """A finished run: its ``--out`` folder, exit code, output and ``results.json`` rows.

    ``stdout`` is what the caller passed (often stdout and stderr together); ``stderr``
    is set when a test reads the two apart. ``run_json`` is read when the run ends: a
    test may delete the folder before it checks.
    """

    out: Path
    returncode: int
    stdout: str
    results: list[dict[str, Any]]
    stderr: str = ""
    run_json: dict[str, Any] = field(default_factory=dict)

    def cells(self, prefix: str, mutant: str = "", having: str = "") -> list[dict[str, Any]]:
        """Rows whose cell id starts with ``prefix`` (and holds ``having``), of ``mutant``
        ("" for the unmutated runs)."""
        return [r for r in self.results if r["cell_id"].startswith(prefix)
                and having in r["cell_id"] and r["mutant"] == mutant]

    def cell(self, prefix: str, mutant: str = "", having: str = "") -> dict[str, Any]:
        """The one row :meth:`cells` finds (the test fails on none or several)."""
        found = self.cells(prefix, mutant, having)
        assert len(found) == 1, (prefix, mutant, having, [r["cell_id"] for r in found])
        return found[0]

    def plain(self) -> list[dict[str, Any]]:
        """The rows of unmutated cells."""
        return [r for r in self.results if not r["mutant"]]

    def by_target(self) -> dict[str, dict[str, Any]]:
        """The rows keyed by target name (for matrices with one cell per target)."""
        return {r["cell_id"].split("[", 1)[0]: r for r in self.results}


def read_run(out: Path, returncode: int, output: str, *, stderr: str = "",
             required: bool = True) -> Run:
    """The run that wrote ``out``. The test fails (showing ``output``) when it left no
    ``results.json``, unless ``required`` is false: then the run has no rows (a test that
    checks several runs lets the others still judge)."""
    results = out / "results.json"
    assert results.is_file() or not required, output[-6000:]
    rows = json.loads(results.read_text()) if results.is_file() else []
    run_json = out / "run.json"
    meta = json.loads(run_json.read_text()) if run_json.is_file() else {}
    return Run(out, returncode, output, rows, stderr=stderr, run_json=meta)
