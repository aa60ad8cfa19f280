"""The recipes (``matrix/recipes.yaml``, ``cpmatrix.recipes``) and ``docs/recipes.md``.

Fast: the recipes are user code (public API only), the matrix runs every recipe, the doc's
table names every recipe and planted bug, the README lists each recipe, and the README's
own-module snippet stays under 30 lines.
Slow: ``cpmatrix run --matrix matrix/recipes.yaml --mutants`` (every cell passes, every
planted bug is killed by the check the doc names) and the README's snippet run as a user
would.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_runner import run_cli
from cpmatrix.parity import CHECKS, declared_mutants

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "matrix" / "recipes.yaml"
DOC = (ROOT / "docs" / "recipes.md").read_text()
README = (ROOT / "README.md").read_text()
RECIPES = ROOT / "src" / "cpmatrix" / "recipes"

#: target -> {mutant: the check that kills it}: what docs/recipes.md promises.
KILLED_BY = {
    "tensor_parallel_mlp": {"both_colwise": "replicated_identical",
                            "row_output_not_reduced": "replicated_identical"},
    "sequence_parallel_block": {"norm_grad_not_reduced": "param_grad"},
    "fsdp_tp_mlp": {"fsdp_skips_param": "param_grad"},
    "ulysses_attention": {"a2a_wrong_split_dim": "output"},
    "ddp_mlp": {"grad_allreduce_skips_axis": "param_grad"},
    "replicate_mlp": {"mean_instead_of_sum": "param_grad"},
    "llama_tp_loss_parallel": {"rope_conjugated": "output"},
    "llama_fsdp_tp": {"fsdp_mean_grads": "param_grad"},
    # cuda only (torch's context_parallel has no CPU path): planned, not run, here
    "torch_context_parallel": {"position_buffer_not_sharded": "output"},
}
#: Targets that run on the cpu platform (the slow test runs them).
CPU_CELLS, CPU_MUTANTS = 25, 29


def _targets() -> list[dict[str, Any]]:
    return list(yaml.safe_load(MATRIX.read_text())["targets"])


def _case(target: dict[str, Any]) -> Any:
    module, function = target["case"].split(":")
    return getattr(importlib.import_module(module), function)


# --------------------------------------------------------------------------------------
# fast


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.py")), ids=lambda p: p.name)
def test_a_recipe_imports_only_the_public_toolkit(path: Path) -> None:
    # recipes are what users copy: nothing private of cpmatrix, nothing of the suite
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            if name.startswith("cpmatrix"):
                assert name in ("cpmatrix.parity", "cpmatrix.cell"), (path.name, name)


def _serial_mlps() -> dict[str, str]:
    """Each recipe's ``class MLP`` (the serial twin), its docstring left out, as AST."""
    found = {}
    for path in sorted(RECIPES.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "MLP":
                body = [n for n in node.body if not (isinstance(n, ast.Expr)
                                                      and isinstance(n.value, ast.Constant))]
                found[path.name] = ast.dump(ast.Module(body=body, type_ignores=[]))
    return found


def test_the_recipes_copies_of_the_serial_mlp_twin_are_one_module() -> None:
    """Each recipe is a self-contained module users copy (the test above), so the MLP twin
    is written out in each that needs it; the copies are the same code, so a fix to one
    is a fix to all, and a recipe's verdicts compare like with like."""
    copies = _serial_mlps()
    assert len(copies) >= 4, copies.keys()
    assert len(set(copies.values())) == 1, sorted(copies)


def test_the_matrix_runs_every_recipe_with_its_planted_bugs() -> None:
    targets = _targets()
    assert {t["name"] for t in targets} == set(KILLED_BY)
    modules = {t["case"].split(":")[0].rsplit(".", 1)[1] for t in targets}
    assert modules == {p.stem for p in RECIPES.glob("*.py") if p.stem != "__init__"}
    for target in targets:
        assert set(declared_mutants(_case(target))) == set(KILLED_BY[target["name"]])
        assert "recipes" in target["tags"]
        assert "1x1" not in target["axes"]["mesh"]  # every bug needs a second rank


def test_the_doc_names_every_recipe_bug_and_the_check_that_kills_it() -> None:
    table = DOC.split("| recipe", 1)[1].split("\n\n", 1)[0]
    for target in _targets():
        assert f"`{target['case'].split('.')[-1]}`" in table, target["case"]
        for mutant, check in KILLED_BY[target["name"]].items():
            assert check in CHECKS
            row = next(line for line in table.splitlines() if f"`{mutant}`" in line)
            assert f"| `{check}`" in row, (mutant, row)


def test_the_readme_has_a_line_per_recipe() -> None:
    section = README.split("### Recipes", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("`")[1] for line in section.splitlines() if line.startswith("- `")}
    assert listed == {p.stem for p in RECIPES.glob("*.py")} - {"__init__"}


def _snippet() -> tuple[str, str]:
    section = README.split("### Your own TP/FSDP2/CP module", 1)[1]
    python = re.search(r"```python\n(.*?)```", section, re.S)
    matrix = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert python and matrix
    return python.group(1), matrix.group(1)


def test_the_own_module_snippet_is_under_30_lines_as_the_doc_says() -> None:
    python, matrix = _snippet()
    lines = [sum(1 for line in block.splitlines() if line.strip()) for block in (python, matrix)]
    assert sum(lines) < 30
    assert f"({lines[0]} lines of Python, {lines[1]} of YAML)" in README
    ast.parse(python)


# --------------------------------------------------------------------------------------
# slow: real worlds


def _run(matrix: Path, out: Path, cwd: Path) -> list[dict[str, Any]]:
    proc = run_cli("run", "--matrix", str(matrix), "--mutants", "--out", str(out), "--plain",
                   "--no-cache", timeout=400, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-4000:]
    results: list[dict[str, Any]] = json.loads((out / "results.json").read_text())
    return results


@pytest.mark.slow
def test_every_recipe_passes_and_every_planted_bug_is_killed_by_its_check(
    tmp_path: Path,
) -> None:
    results = _run(MATRIX, tmp_path / "out", ROOT)
    plain = [r for r in results if not r["mutant"]]
    assert len(plain) == CPU_CELLS and all(r["status"] == "passed" for r in plain)
    for r in plain:  # every cell shows what was sharded, over which axes
        assert r["evidence"]["parity.check.sharding_active"].startswith("ok:"), r["cell_id"]
        assert r["evidence"]["parity.sharded"], r["cell_id"]
    mutant_runs = [r for r in results if r["mutant"]]
    assert len(mutant_runs) == CPU_MUTANTS
    for r in mutant_runs:
        target = r["cell_id"].split("[")[0]
        assert r["status"] == "killed", r["cell_id"]
        assert r["evidence"]["mutant_outcome"] == "killed", r["cell_id"]
        assert r["evidence"]["killed_by"] == KILLED_BY[target][r["mutant"]], (
            r["cell_id"], r["mutant"], r["failures"])


@pytest.mark.slow
def test_the_own_module_snippet_runs_as_a_user_would(tmp_path: Path) -> None:
    python, matrix = _snippet()
    (tmp_path / "my_cases.py").write_text(python)
    (tmp_path / "my_matrix.yaml").write_text(matrix)
    results = _run(tmp_path / "my_matrix.yaml", tmp_path / "out", tmp_path)
    assert sorted((r["cell_id"].split(",")[1], r["mutant"], r["status"]) for r in results) == [
        ("1x2", "", "passed"), ("1x2", "no_allreduce", "killed"),
        ("2x2", "", "passed"), ("2x2", "no_allreduce", "killed")]
    assert {r["evidence"].get("killed_by") for r in results if r["mutant"]} == {
        "replicated_identical"}
