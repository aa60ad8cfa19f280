"""Cell ids: unique, made of safe characters, and parsing back into the cell they name.

An id can be longer than a file name may be (255 bytes): the cell's folder is then
``cell_folder(id)``, a prefix and a digest (tests/worlds/test_trust.py runs such a cell).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpmatrix.kinds.pytest.collect import collect_target
from cpmatrix.matrix.cellid import CellKey, format_cell_id, parse_cell_id, render_value
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix
from cpmatrix.matrix.schema import Cell
from cpmatrix.supervise.entry import cell_folder

RESOURCES = Path(__file__).parents[1] / "resources"
FIXTURES = sorted(RESOURCES.glob("*.yaml"))
#: What the README promises an id is made of.
SAFE = re.compile(r"[A-Za-z0-9_.+\-\[\],=@]+")


def key_of(cell: Cell) -> CellKey:
    return CellKey(
        target=cell.target, level=cell.level, mesh=str(cell.mesh), dtype=cell.dtype,
        autocast=cell.autocast, path=cell.path,
        params=tuple((k, render_value(v)) for k, v in cell.params), platform=cell.platform,
    )


def test_there_are_fixture_matrices() -> None:
    names = {p.name for p in FIXTURES}
    assert {"basic.yaml", "complete.yaml", "grid.yaml"} <= names


@pytest.mark.parametrize("matrix_file", FIXTURES, ids=lambda p: p.name)
def test_ids_are_unique_safe_and_parse_back(matrix_file: Path, tmp_path: Path) -> None:
    # A pytest target's tests are collected by the pytest kind's collector, as the CLI's.
    expansion = expand(load_matrix(matrix_file), collect=collect_target)
    cells = expansion.cells
    assert cells
    ids = [c.id for c in cells]
    assert len(set(ids)) == len(ids)
    assert not set(ids) & {e.id for e in expansion.excluded}
    for cell in cells:
        assert SAFE.fullmatch(cell.id), cell.id
        assert parse_cell_id(cell.id) == key_of(cell)
        # Its folder name is really usable as a file name here.
        (tmp_path / cell_folder(cell.id)).write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(cell_folder(i) for i in ids)
    for excluded in expansion.excluded:
        assert SAFE.fullmatch(excluded.id)
        parse_cell_id(excluded.id)


@pytest.mark.parametrize(
    ("parts", "cell_id"),
    [
        (("ring_attention", "unit", "2x2", "bf16", True, "kernel", (("seq", 7),), "cpu"),
         "ring_attention[unit,2x2,bf16,autocast=on,kernel,seq=7]@cpu"),
        (("t", "workflow", "1x1", "fp64", False, "reference", (), "cuda"),
         "t[workflow,1x1,fp64,autocast=off,reference]@cuda"),
        (("t", "layer", "3x3", "fp16", False, "reference",
          (("causal", True), ("mode", "b.c"), ("eps", 1e-05), ("n", -2)), "cpu"),
         "t[layer,3x3,fp16,autocast=off,reference,causal=true,mode=b.c,eps=1e-05,n=-2]@cpu"),
    ],
)
def test_format_and_parse_round_trip(parts: tuple, cell_id: str) -> None:  # type: ignore[type-arg]
    assert format_cell_id(*parts) == cell_id
    key = parse_cell_id(cell_id)
    target, level, mesh, dtype, autocast, path, params, platform = parts
    assert key == CellKey(target, level, mesh, dtype, autocast, path,
                          tuple((k, render_value(v)) for k, v in params), platform)


@pytest.mark.parametrize(
    ("cell_id", "fragment"),
    [
        ("", "expected target[level,mesh,dtype"),
        ("t[unit,1x1,fp64,autocast=off,reference]", "expected target["),
        ("t[unit,1x1,fp64,autocast=off,reference]@cpu\n", "expected target["),
        ("t(unit,1x1,fp64,autocast=off,reference)@cpu", "expected target["),
        ("t[unit,1x1,fp64,reference]@cpu", "expected target["),
        ("t[unit,1x1,fp64,autocast=yes,reference]@cpu", "autocast must be on or off"),
        ("t[kernel,1x1,fp64,autocast=off,reference]@cpu", "unknown level 'kernel'"),
        ("t[unit,2*2,fp64,autocast=off,reference]@cpu", "mesh '2*2' is not RxC"),
        ("t[unit,1x1,fp8,autocast=off,reference]@cpu", "unknown dtype 'fp8'"),
        ("t[unit,1x1,fp64,autocast=off,triton]@cpu", "unknown path 'triton'"),
        ("t[unit,1x1,fp64,autocast=off,reference,seq]@cpu", "parameter 'seq' is not k=v"),
        ("t[unit,1x1,fp64,autocast=off,reference,=7]@cpu", "parameter '=7' is not k=v"),
        ("t[unit,1x1,fp64,autocast=off,reference,s=a=b]@cpu", "parameter 's=a=b' is not k=v"),
        ("t-x[unit,1x1,fp64,autocast=off,reference]@cpu", "expected target["),
    ],
)
def test_malformed_ids_are_refused_with_the_expected_shape(cell_id: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_cell_id(cell_id)
