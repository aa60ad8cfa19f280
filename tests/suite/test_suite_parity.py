"""CP vs serial parity of every reference-suite op, and its negative controls, run by cpmatrix.

The hand-written checks of ``_suite_checks`` (a second opinion on the suite, written without
the parity toolkit) are cases (``_suite_cases``) of ``tests/resources/suite_checks.yaml``;
``cpmatrix run`` runs them in its own batched worlds, as it runs a user's cases. Meshes: 1x1
(no-op collectives), 1x2 (even sizes; also the Triton kernel path, fp32, and bf16 with and
without autocast), 2x2 (padding: N=5), 2x3 (both axes > 1; N=9, so one column shard and one
sequence shard hold a single real element and others none). Every planted mutant of
``cpmatrix.suite`` must be killed by a numerical mismatch (not a crash) of the check
``_suite_cases.MUTANT_CHECKS`` names, on 2x2 in fp64 and two of them also in bf16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # helpers, also under --import-mode=importlib

from _suite_cases import MUTANT_CHECKS
from _suite_checks import CHECKS

from cli_runner import RES, run_cli
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix
from cpmatrix.suite.mutants import MUTANTS

MATRIX = RES / "suite_checks.yaml"
CELLS = [c.id for c in expand(load_matrix(MATRIX)).cells]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One ``cpmatrix run`` of the whole matrix; its results by cell id."""
    out = tmp_path_factory.mktemp("suite-checks")
    proc = run_cli("run", "--matrix", str(MATRIX), "--out", str(out), "--plain", "--no-cache",
                   timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    by_id = {r["cell_id"]: r for r in json.loads((Path(out) / "results.json").read_text())}
    assert sorted(by_id) == sorted(CELLS), "every cell of the matrix ends as one result"
    return by_id


@pytest.mark.slow
@pytest.mark.parametrize("cell_id", CELLS)
def test_cell(results: dict[str, dict[str, Any]], cell_id: str) -> None:
    r = results[cell_id]
    # self-verifying log: the evidence is printed on success too (pytest -rP shows it)
    print(cell_id, *(f"{k}: {v}" for k, v in r["evidence"].items()), sep="\n  ")
    assert r["status"] == "passed", "\n".join(f["message"] for f in r["failures"])


def test_every_check_and_every_mutant_is_in_the_matrix() -> None:
    assert {c.split("check=")[1].split("]")[0] for c in CELLS if "check=" in c} == set(CHECKS)
    assert set(MUTANT_CHECKS) == set(MUTANTS)
    assert set(MUTANT_CHECKS.values()) <= set(CHECKS)
    planted = {c.split("plant=")[1].split("]")[0] for c in CELLS if "plant=" in c}
    assert planted == set(MUTANTS)
