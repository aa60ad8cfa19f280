"""Issue 12's reports on real torchrun worlds: TP on the ``cp1`` sub-mesh, FSDP2 over ``cp0``
with TP over ``cp1``, and a DTensor on a mesh that is not part of the cell's.

The cases are in ``tests/resources/parity/submesh_cases.py``; the pure rules they exercise are
tested fast in ``tests/unit/test_parity_submesh.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli_runner import RES, run_cli

# --------------------------------------------------------------------------------------
# real worlds


@pytest.fixture(scope="module")
def submesh_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("submesh")
    proc = run_cli("run", "--matrix", str(RES / "parity" / "submesh.yaml"), "--out", str(out),
                   "--plain", timeout=400)
    results = json.loads((out / "results.json").read_text())
    assert proc.returncode == 1, proc.stdout  # the foreign-mesh cell must fail
    return {r["cell_id"].split("[")[0] + "@" + r["cell_id"].split(",")[1]: r for r in results}


@pytest.mark.slow
def test_tp_on_the_cp1_sub_mesh_passes_with_its_parameters_as_evidence(
    submesh_run: dict[str, dict[str, Any]],
) -> None:
    # reported: IndexError: tuple index out of range in every cell
    for mesh, local in (("1x2", 6), ("1x3", 4)):
        r = submesh_run[f"tp_mlp_cp1@{mesh}"]
        assert r["status"] == "passed", r["failures"]
        ev = r["evidence"]
        assert ev["parity.sharded"] == ("param up.weight over cp1; param up.bias over cp1; "
                                        "param down.weight over cp1")
        assert f"param up.weight: local ({local}, 8) < global (12, 8) on dim 0 over cp1" in (
            ev["parity.check.sharding_active"])
        assert ev["parity.check.param_grad"].endswith("1 tensors bitwise identical over cp1")


@pytest.mark.slow
def test_fsdp2_over_cp0_with_tp_over_cp1_and_a_replicated_input_is_not_vacuous(
    submesh_run: dict[str, dict[str, Any]],
) -> None:
    # reported: VacuousError: sharding_active (only sharded inputs counted)
    r = submesh_run["fsdp_tp@2x2"]
    assert r["status"] == "passed", r["failures"]
    ev = r["evidence"]
    assert ev["parity.sharded"] == ("param up.weight over cp0+cp1; param up.bias over cp0+cp1; "
                                    "param down.weight over cp0+cp1; param down.bias over cp0")
    assert ev["parity.check.output"].startswith("ok")


@pytest.mark.slow
def test_a_dtensor_on_a_foreign_mesh_fails_setup_on_every_rank(
    submesh_run: dict[str, dict[str, Any]],
) -> None:
    r = submesh_run["foreign_mesh@2x2"]
    assert r["status"] == "failed"
    failure = r["failures"][0]
    assert failure["check"] == "setup", failure
    assert ("activation odd: a DTensor on a mesh not part of the cell's mesh: its dim b "
            "(2 ranks) runs across the cell's dims ('cp0', 'cp1') (4 ranks)") in failure["message"]
    assert "IndexError" not in failure["message"]
