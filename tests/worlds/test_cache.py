"""The result cache, end to end through the real CLI and real gloo worlds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpmatrix.cache.key import ActionKeys, ResultCache
from cpmatrix.result import Result, Status

RES = Path(__file__).parents[1] / "resources"


def run(project: Path, cache: Path, *extra: str) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "cpmatrix", "run", "--matrix", str(project / "matrix.yaml"),
         "--out", str(project / "out"), "--cache-dir", str(cache), "--plain", *extra],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    results = json.loads((project / "out" / "results.json").read_text())
    return {r["cell_id"].split("[")[0] + r["cell_id"].split(",")[1]: r["status"] for r in results}


@pytest.mark.slow
def test_rerun_reuses_passes_and_edits_rerun_exactly_their_cells(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(RES / "cache_project", project)
    cache = tmp_path / "cache"
    first = run(project, cache)
    assert first == {"alpha1x1": "passed", "alpha1x2": "passed", "beta1x1": "passed",
                     "flaky_fail1x1": "failed"}
    # Nothing changed: every pass is reused; the failure is never cached.
    assert run(project, cache) == {**first, "alpha1x1": "cached", "alpha1x2": "cached",
                                   "beta1x1": "cached"}
    # Editing a project-local module imported by cache_a re-runs exactly alpha's cells.
    helper = project / "cases" / "cache_helper.py"
    helper.write_text(helper.read_text().replace("2.0", "3.0"))
    assert run(project, cache) == {**first, "beta1x1": "cached"}
    # Editing cache_b re-runs beta (and the failing cell, which always runs).
    mod = project / "cases" / "cache_b.py"
    mod.write_text(mod.read_text() + "\n# edited\n")
    assert run(project, cache) == {**first, "alpha1x1": "cached", "alpha1x2": "cached"}
    # --no-cache forces a run.
    assert run(project, cache, "--no-cache") == first


def test_corrupt_entries_are_ignored_and_only_passes_are_stored(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    ok = Result(cell_id="c", status=Status.PASSED, evidence={"x": 1})
    cache.put("ab" * 32, ok, {})
    hit = cache.get("ab" * 32, "c")
    assert hit is not None and hit.status is Status.CACHED and hit.evidence == {"x": 1}
    assert cache.get("ab" * 32, "other-cell") is None
    path = tmp_path / "results" / "ab" / f"{'ab' * 32}.json"
    path.write_text("{not json")
    assert cache.get("ab" * 32, "c") is None
    cache.put("ab" * 32, ok, {})  # rewritten by the next pass
    assert cache.get("ab" * 32, "c") is not None
    for status in (Status.FAILED, Status.FLAKY, Status.TIMEOUT, Status.CRASH):
        cache.put("cd" * 32, Result(cell_id="c", status=status), {})
        assert cache.get("cd" * 32, "c") is None
    assert not list(tmp_path.glob("results/*/.tmp-*")), "no partial entries left behind"


def test_closure_follows_project_local_imports_only(tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(RES / "cache_project", project)
    keys = ActionKeys(search_path=(str(project / "cases"),))
    before = keys.module_closure_digest("cache_a")
    assert before == ActionKeys(search_path=(str(project / "cases"),)).module_closure_digest(
        "cache_a")
    (project / "cases" / "cache_helper.py").write_text("SCALE = 5.0\n")
    after = ActionKeys(search_path=(str(project / "cases"),)).module_closure_digest("cache_a")
    assert after != before
    # torch is imported by cache_a but is not project-local: it is not read.
    assert "torch" not in keys.sources._cache
