"""``merge_shards`` on synthetic shard folders: each cell once, a missing cell never dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.report import read_report
from cpmatrix.report.junit import results_to_junit, write_junit
from cpmatrix.report.merge import ShardManifest, merge_shards, selection_digest
from cpmatrix.result import Result, Status

CELLS = [f"t{i}[unit,1x1,fp64,autocast=off,reference]@cpu" for i in range(5)]
PARTITION = ((CELLS[0], CELLS[3]), (CELLS[1], CELLS[4]), (CELLS[2],))


def _shard(folder: Path, k: int, status: Status = Status.PASSED) -> Path:
    folder.mkdir(parents=True)
    results = [Result(cell_id=c, status=status, duration_s=1.0 + k,
                      evidence={"max_abs": f"1e-{k + 10}"}) for c in PARTITION[k - 1]]
    write_junit(folder / "report.xml", results_to_junit(results, {}))
    atomic_write_json(folder / "results.json", [r.to_dict() for r in results])
    atomic_write_json(folder / "durations.json", {"old-cell": 9.0})
    ShardManifest(shard=k, of=3, selection=selection_digest(CELLS),
                  partition=PARTITION).write(folder)
    return folder


def test_every_cell_once_with_its_evidence(tmp_path: Path) -> None:
    shards = [_shard(tmp_path / f"s{k}", k) for k in (1, 2, 3)]
    summary = merge_shards(shards, tmp_path / "m")
    assert summary.missing == () and summary.duplicates == () and summary.cells == 5
    cells = read_report(tmp_path / "m" / "report.xml")
    assert sorted(c.cell_id for c in cells) == sorted(CELLS)
    assert all(c.status is Status.PASSED for c in cells)
    assert {c.cell_id: c.evidence["max_abs"] for c in cells}[CELLS[4]] == "1e-12"
    durations = json.loads((tmp_path / "m" / "durations.json").read_text())
    assert durations["old-cell"] == 9.0 and durations[CELLS[2]] == 4.0


def test_a_cell_no_shard_reported_is_missing_never_dropped(tmp_path: Path) -> None:
    shards = [_shard(tmp_path / f"s{k}", k) for k in (1, 3)]
    summary = merge_shards(shards, tmp_path / "m")
    assert summary.missing == (CELLS[1], CELLS[4])
    cells = {c.cell_id: c for c in read_report(tmp_path / "m" / "report.xml")}
    assert set(cells) == set(CELLS)
    for c in summary.missing:
        assert cells[c].status is Status.INTERRUPTED
        assert "belongs to shard 2/3" in cells[c].properties["message"]


def test_a_folder_given_twice_counts_each_cell_once(tmp_path: Path) -> None:
    one = _shard(tmp_path / "s1", 1)
    summary = merge_shards([one, one, _shard(tmp_path / "s2", 2), _shard(tmp_path / "s3", 3)],
                           tmp_path / "m")
    assert sorted(summary.duplicates) == sorted(PARTITION[0])
    assert len(read_report(tmp_path / "m" / "report.xml")) == 5


def test_a_shard_without_results_is_a_warning_and_its_cells_missing(tmp_path: Path) -> None:
    died = _shard(tmp_path / "s2", 2)
    (died / "results.json").unlink()
    summary = merge_shards([_shard(tmp_path / "s1", 1), died, _shard(tmp_path / "s3", 3)],
                           tmp_path / "m")
    assert summary.missing == PARTITION[1] and "no results.json" in summary.warnings[0]


def test_shards_of_another_selection_are_refused(tmp_path: Path) -> None:
    other = _shard(tmp_path / "other", 2)
    ShardManifest(shard=2, of=3, selection="another",
                  partition=PARTITION).write(other)
    with pytest.raises(UsageError, match="different selections"):
        merge_shards([_shard(tmp_path / "s1", 1), other], tmp_path / "m")
