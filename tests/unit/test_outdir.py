"""``--out``'s claim and the previous run's evidence (``cpmatrix.supervise.outdir``), on real
folders and real locks: claiming deletes nothing; a run with cells keeps the last run's
outputs as ``previous/``, once; a second claim is refused and moves nothing."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.layout import DURATIONS, MARKER, OUTPUTS, PREVIOUS
from cpmatrix.supervise import outdir
from cpmatrix.supervise.outdir import claim_out, keep_previous


def _a_run(out: Path, tag: str) -> dict[str, str]:
    """Write every output a run writes, each holding ``tag``; what was written."""
    files = {}
    for name in OUTPUTS:
        path = out / name
        if "." in name:
            path.write_text(tag)
            files[name] = tag
        else:
            (path / "x").mkdir(parents=True)
            (path / "x" / "log").write_text(tag)
            files[f"{name}/x/log"] = tag
    return files


def _read(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_doctests_run() -> None:
    assert doctest.testmod(outdir).failed == 0


def test_claiming_deletes_nothing_and_a_run_with_cells_keeps_the_last_as_previous(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).touch()
    first = _a_run(out, "run 1")
    (out / DURATIONS).write_text("{}")
    claim = claim_out(out)
    try:
        assert {k: v for k, v in _read(out).items() if k in first} == first  # untouched
        claim.take_over()
        assert _read(out / PREVIOUS) == {**first, DURATIONS: "{}"}
        assert not any((out / name).exists() for name in OUTPUTS)
        assert (out / DURATIONS).read_text() == "{}"  # the history stays in place
        second = _a_run(out, "run 2")
        claim.take_over()  # once per claim: this run's own files stay
        assert {k: v for k, v in _read(out).items() if k in second} == second
    finally:
        claim.release()
    claim = claim_out(out)
    try:
        claim.take_over()  # the next run: run 2 is the previous one now, run 1 is gone
        assert _read(out / PREVIOUS) == {**second, DURATIONS: "{}"}
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [MARKER, ".cpmatrix.lock", DURATIONS, PREVIOUS])
    finally:
        claim.release()


def test_a_second_claim_is_refused_and_moves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    claim = claim_out(out)
    try:
        written = _a_run(out, "held")
        with pytest.raises(UsageError, match="in use by run"):
            claim_out(out)
        assert {k: v for k, v in _read(out).items() if k in written} == written
        assert not (out / PREVIOUS).exists()
    finally:
        claim.release()


def test_leftovers_without_a_report_never_replace_a_previous_report(tmp_path: Path) -> None:
    out = tmp_path
    good = _a_run(out, "good")
    keep_previous(out)
    (out / "cells" / "y").mkdir(parents=True)  # a killed run: folders, no report
    (out / "cells" / "y" / "log").write_text("killed")
    keep_previous(out)
    assert _read(out / PREVIOUS) == good
    assert not (out / "cells").exists()
    # With no previous/ at all, leftovers are better than nothing: they are kept.
    fresh = tmp_path / "fresh"
    (fresh / "worlds").mkdir(parents=True)
    (fresh / "worlds" / "log").write_text("partial")
    keep_previous(fresh)
    assert _read(fresh / PREVIOUS) == {"worlds/log": "partial"}


def test_a_folder_of_someone_else_is_refused_untouched(tmp_path: Path) -> None:
    (tmp_path / "report.xml").write_text("mine")
    with pytest.raises(UsageError, match="not a cpmatrix output folder"):
        claim_out(tmp_path)
    assert (tmp_path / "report.xml").read_text() == "mine"
