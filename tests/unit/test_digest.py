"""Digests: stable across processes, and changed by exactly what a cell depends on."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from cpmatrix.digest import (
    ModuleSources,
    canonical_json,
    cell_digest,
    cell_digest_from_parts,
)
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix

RESOURCES = Path(__file__).parents[1] / "resources"
GRID = RESOURCES / "grid.yaml"


def id_digests(matrix_file: Path) -> dict[str, str]:
    return {c.id: c.digest for c in expand(load_matrix(matrix_file)).cells}


def copy_fixture(tmp_path: Path) -> Path:
    shutil.copy(GRID, tmp_path / "grid.yaml")
    shutil.copytree(RESOURCES / "cases", tmp_path / "cases")
    return tmp_path / "grid.yaml"


def test_editing_one_case_module_changes_only_its_cells(tmp_path: Path) -> None:
    matrix_file = copy_fixture(tmp_path)
    before = expand(load_matrix(matrix_file)).cells
    module_b = tmp_path / "cases" / "grid_cases_b.py"
    module_b.write_text(module_b.read_text() + "\n# a comment is an edit too\n")
    after = expand(load_matrix(matrix_file)).cells

    assert [c.id for c in before] == [c.id for c in after]
    changed = {b.id for b, a in zip(before, after, strict=True) if b.digest != a.digest}
    in_b = {c.id for c in before if c.case.startswith("grid_cases_b:")}
    assert in_b and changed == in_b


def test_editing_a_platform_changes_only_its_cells(tmp_path: Path) -> None:
    matrix_file = copy_fixture(tmp_path)
    before = id_digests(matrix_file)
    text = matrix_file.read_text()
    edited = text.replace("device: cuda}", "device: cuda, env: {X: '1'}}")
    assert edited != text
    matrix_file.write_text(edited)
    after = id_digests(matrix_file)
    assert before.keys() == after.keys()
    changed = {i for i in before if before[i] != after[i]}
    assert changed == {i for i in before if i.endswith("@cuda")}


def test_editing_a_target_changes_only_its_cells(tmp_path: Path) -> None:
    matrix_file = copy_fixture(tmp_path)
    before = id_digests(matrix_file)
    matrix_file.write_text(matrix_file.read_text().replace("timeout: 120", "timeout: 121"))
    after = id_digests(matrix_file)
    changed = {i for i in before if before[i] != after[i]}
    assert changed == {i for i in before if i.startswith("allgather[")}


def test_edits_that_do_not_change_a_cell_keep_its_digest(tmp_path: Path) -> None:
    """Comments, descriptions, target order and pythonpath spelling are not inputs."""
    matrix_file = copy_fixture(tmp_path)
    before = id_digests(matrix_file)
    text = matrix_file.read_text()
    start = text.index("  - name: ring_attention")
    middle = text.index("  - name: allgather")
    end = text.index("exclude:")
    reordered = text[:start] + text[middle:end] + text[start:middle] + text[end:]
    reordered = reordered.replace("pythonpath: [cases]", "pythonpath: [./cases/]  # moved")
    described = reordered.replace("device: cpu,", "device: cpu, description: words,")
    assert described != reordered
    reordered = described
    matrix_file.write_text("# a new comment\n" + reordered)
    assert id_digests(matrix_file) == before


def test_digest_is_sha256_over_spec_source_and_platform() -> None:
    matrix = load_matrix(GRID)
    sources = ModuleSources(matrix.pythonpath)
    for cell in expand(matrix).cells:
        spec = cell.to_dict()
        del spec["digest"]
        source = sources.read(cell.case.split(":")[0])
        platform = matrix.platform(cell.platform).to_dict()
        assert cell.digest == cell_digest(spec, source, platform)
        assert len(cell.digest) == 64 and int(cell.digest, 16) >= 0


def test_cell_digest_parts_agree_and_key_order_does_not_matter() -> None:
    spec = {"b": 1, "a": [1, "x"], "c": {"z": 1, "y": None}}
    same = {"c": {"y": None, "z": 1}, "a": [1, "x"], "b": 1}
    assert canonical_json(spec) == canonical_json(same)
    assert canonical_json(spec) == '{"a":[1,"x"],"b":1,"c":{"y":null,"z":1}}'
    platform = {"name": "cpu", "env": {}}
    d = cell_digest(spec, b"src", platform)
    assert d == cell_digest(same, b"src", platform)
    assert d == cell_digest_from_parts(
        canonical_json(spec), hashlib.sha256(b"src").digest(), canonical_json(platform)
    )
    assert d != cell_digest(spec, b"src ", platform)
    assert d != cell_digest({**spec, "b": "1"}, b"src", platform)


def test_module_sources_search_path_then_sys_path(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("# package\n")
    (tmp_path / "pkg" / "leaf.py").write_text("# leaf\n")
    (tmp_path / "json.py").write_text("# shadows the stdlib for digests\n")
    sources = ModuleSources([str(tmp_path)])
    assert sources.read("pkg") == b"# package\n"
    assert sources.read("pkg.leaf") == b"# leaf\n"
    assert sources.read("json") == b"# shadows the stdlib for digests\n"
    assert sources.locate("cpmatrix.digest").endswith(os.path.join("cpmatrix", "digest.py"))
    with pytest.raises(LookupError, match=r"'pkg\.nope' not found"):
        sources.read("pkg.nope")
