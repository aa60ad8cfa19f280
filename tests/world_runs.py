"""One real ``cpmatrix run`` as the world tests read it: folder, exit code, output, rows.

Several world tests start one run in a module-scoped fixture and check many things in
it; they share this holder instead of each writing its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Run", "read_run"]


@dataclass(frozen=True)
class Run:
    """A finished run: its ``--out`` folder, exit code, output and ``results.json`` rows."""

    out: Path
    returncode: int
    stdout: str
    results: list[dict[str, Any]]

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


def read_run(out: Path, returncode: int, output: str) -> Run:
    """The run that wrote ``out``; the test fails (showing ``output``) when it left no
    ``results.json``."""
    results = out / "results.json"
    assert results.is_file(), output[-6000:]
    return Run(out, returncode, output, json.loads(results.read_text()))
