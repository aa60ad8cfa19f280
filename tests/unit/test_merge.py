"""``merge_shards`` on synthetic shard folders: each cell once, a missing cell never dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.report import read_report
from cpmatrix.report.history import durations_of, read_histories
from cpmatrix.report.junit import results_to_junit, write_junit
from cpmatrix.report.merge import ShardManifest, merge_shards, selection_digest
from cpmatrix.result import Result, Status

CELLS = [f"t{i}[unit,1x1,fp64,autocast=off,reference]@cpu" for i in range(5)]
PARTITION = ((CELLS[0], CELLS[3]), (CELLS[1], CELLS[4]), (CELLS[2],))


#: The run-level source every synthetic shard records (as ``cpmatrix run`` does).
RUN_SOURCE = {"matrix": "m" * 64, "cpmatrix": "0.1.0", "runtime": "r" * 64, "commit": ""}


def _source(cell_id: str, version: str = "today") -> dict[str, str]:
    return {"digest": f"{version}-{cell_id}", **RUN_SOURCE}


def _shard(folder: Path, k: int, status: Status = Status.PASSED, version: str = "today",
           source: bool = True) -> Path:
    folder.mkdir(parents=True)
    results = [Result(cell_id=c, status=status, duration_s=1.0 + k,
                      evidence={"max_abs": f"1e-{k + 10}"},
                      source=_source(c, version) if source else {})
               for c in PARTITION[k - 1]]
    write_junit(folder / "report.xml", results_to_junit(results, {}))
    atomic_write_json(folder / "results.json", [r.to_dict() for r in results])
    atomic_write_json(folder / "durations.json", {"old-cell": 9.0})
    if source:  # the digests of the whole selection, as every shard records them
        atomic_write_json(folder / "run.json", {"run_id": f"r{k}", "source": {
            **RUN_SOURCE, "cells": {c: _source(c, version)["digest"] for c in CELLS}}})
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
    # The old form of durations.json (seconds only) is still read; the merge writes histories.
    durations = durations_of(read_histories(tmp_path / "m" / "durations.json"))
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


# --------------------------------------------------------------------------------------
# one source, and no first-wins (issue 21, rows 6 and 7)


def test_shards_from_different_sources_are_refused_naming_the_cells(tmp_path: Path) -> None:
    # Yesterday's shard 1 and today's shards 2 and 3: they share no cell, but each
    # records the digests of the whole selection, so the merge sees they differ.
    old = _shard(tmp_path / "s1", 1, version="yesterday")
    with pytest.raises(UsageError, match="different sources") as err:
        merge_shards([old, _shard(tmp_path / "s2", 2), _shard(tmp_path / "s3", 3)],
                     tmp_path / "m")
    message = str(err.value)
    assert f"{len(CELLS)} cells have different source digests" in message
    for cell in CELLS:
        assert cell in message
    assert "yesterday-" not in message.split(":", 1)[0]  # digests shortened, cells named
    assert not (tmp_path / "m" / "report.xml").exists()


def test_results_without_a_source_are_refused(tmp_path: Path) -> None:
    old = _shard(tmp_path / "s1", 1, source=False)  # an older cpmatrix wrote it
    with pytest.raises(UsageError, match="carry no source digest"):
        merge_shards([old, _shard(tmp_path / "s2", 2)], tmp_path / "m")


def test_two_results_that_disagree_are_a_conflict_that_fails(tmp_path: Path) -> None:
    # An old passing run of shard 1 given before today's failing one: never first-wins.
    passing = _shard(tmp_path / "old", 1)
    failing = _shard(tmp_path / "new", 1, status=Status.FAILED)
    for order in ([passing, failing], [failing, passing]):
        out = tmp_path / f"m-{order[0].name}"
        summary = merge_shards([*order, _shard(tmp_path / f"s2-{order[0].name}", 2),
                                _shard(tmp_path / f"s3-{order[0].name}", 3)], out)
        assert sorted(summary.conflicts) == sorted(PARTITION[0])
        assert summary.duplicates == ()
        cells = {c.cell_id: c for c in read_report(out / "report.xml")}
        for cell in PARTITION[0]:
            assert cells[cell].status is Status.FAILED, cell
            assert "conflict" in cells[cell].properties["message"]
            assert "passed" in cells[cell].properties["message"]
            assert "failed" in cells[cell].properties["message"]
        rows = {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}
        assert rows[PARTITION[0][0]]["status"] == "failed"
        assert rows[PARTITION[1][0]]["status"] == "passed"


def test_a_cached_and_a_fresh_pass_agree(tmp_path: Path) -> None:
    fresh = _shard(tmp_path / "fresh", 1)
    cached = _shard(tmp_path / "cached", 1, status=Status.CACHED)
    summary = merge_shards([fresh, cached], tmp_path / "m")
    assert summary.conflicts == () and sorted(summary.duplicates) == sorted(PARTITION[0])


def test_other_matrix_bytes_with_the_same_cell_digests_merge_with_a_warning(
        tmp_path: Path) -> None:
    one, two = _shard(tmp_path / "s1", 1), _shard(tmp_path / "s2", 2)
    run = json.loads((two / "run.json").read_text())
    run["source"]["matrix"] = "n" * 64  # a comment edited between the shard jobs
    atomic_write_json(two / "run.json", run)
    summary = merge_shards([one, two, _shard(tmp_path / "s3", 3)], tmp_path / "m")
    assert any("different matrix files" in w for w in summary.warnings), summary.warnings
    merged = json.loads((tmp_path / "m" / "run.json").read_text())
    assert merged["source"]["cells"] == {c: f"today-{c}" for c in CELLS}


def test_a_missing_cell_keeps_the_digest_its_selection_gave_it(tmp_path: Path) -> None:
    merge_shards([_shard(tmp_path / "s1", 1), _shard(tmp_path / "s3", 3)], tmp_path / "m")
    rows = {r["cell_id"]: r for r in json.loads((tmp_path / "m" / "results.json").read_text())}
    assert rows[CELLS[1]]["status"] == "interrupted"
    assert rows[CELLS[1]]["source"]["digest"] == f"today-{CELLS[1]}"
    # ... so the merged folder merges again with the late shard 2, whose results take
    # the place of the placeholders (interrupted is no verdict, so no conflict).
    summary = merge_shards([tmp_path / "m", _shard(tmp_path / "s2", 2)], tmp_path / "m2")
    assert summary.missing == () and summary.conflicts == () and summary.duplicates == ()
    cells = {c.cell_id: c for c in read_report(tmp_path / "m2" / "report.xml")}
    assert {c.status for c in cells.values()} == {Status.PASSED}, cells
