"""The cache key completed by observation (issue 21, rows 4, 4b and 5), through the real
CLI and real gloo worlds.

``resources/observed_project`` has one cell per route by which a case reaches code or
data that its static pre-key cannot see: an editable install of the user's own package
(pip install -e into a venv made with --system-site-packages), the same module reused
by a later cell without importing it, a data file, a module loaded by path with
importlib, a folder the case adds to sys.path, a module dropped into the venv's
site-packages outside any distribution, a module found through a ``.pth`` file; and a
cell that crashes once and passes when retried (FLAKY).

One venv and three runs, in a module fixture: the first stores the passes (and must not
store the retried one), the second reuses them, the third runs after every route was
edited: each cell of a route fails, none is ``cached``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_runner import RES, run_cli
from cpmatrix.cache.key import WORKER_ENTRIES, ActionKeys
from cpmatrix.cache.portable import Anchors
from cpmatrix.paths import PACKAGE_DIR

pytestmark = pytest.mark.slow

ROUTES = {  # cell -> the file (relative to the project, or in the venv) it depends on
    "editable": "userpkg/src/userlib/__init__.py",
    "editable_again": "userpkg/src/userlib/__init__.py",
    "data_file": "data/values.txt",
    "importlib_path": "loose/by_path.py",
    "sys_path_folder": "extra/extra_mod.py",
    "site_dropped": "SITE/dropped_mod.py",
    "pth_path": "pthdir/pth_mod.py",
}


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "project"
        self.venv = root / "venv"
        self.cache = root / "cache"
        self.runs: list[dict[str, dict[str, Any]]] = []
        self.stdout: list[str] = []

    @property
    def site(self) -> Path:
        return next((self.venv / "lib").glob("python3*/site-packages"))

    def file(self, cell: str) -> Path:
        rel = ROUTES[cell]
        return self.site / rel[5:] if rel.startswith("SITE/") else self.dir / rel

    def run(self) -> dict[str, dict[str, Any]]:
        out = self.root / f"out{len(self.runs)}"
        proc = run_cli("run", "--matrix", str(self.dir / "matrix.yaml"), "--out", str(out),
                       "--cache-dir", str(self.cache), "--keep-order", "--plain",
                       "--python", str(self.venv / "bin" / "python"), timeout=600)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        results = {r["cell_id"].split("[", 1)[0]: r
                   for r in json.loads((out / "results.json").read_text())}
        self.runs.append(results)
        self.stdout.append(proc.stdout + proc.stderr)
        return results

    def entries(self) -> dict[str, dict[str, Any]]:
        """The cache's entries, by target."""
        found = {}
        for path in self.cache.glob("results/*/*.json"):
            data = json.loads(path.read_text())
            found[data["result"]["cell_id"].split("[", 1)[0]] = data
        return found


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    p = Project(tmp_path_factory.mktemp("observed"))
    shutil.copytree(RES / "observed_project", p.dir)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(p.venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(p.venv / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-e", str(p.dir / "userpkg")], check=True, timeout=300)
    shutil.copy(p.dir / "site" / "dropped_mod.py", p.site / "dropped_mod.py")
    (p.site / "extra_path.pth").write_text(f"{p.dir / 'pthdir'}\n")
    p.run()          # stores the passes
    p.stored = p.entries()  # type: ignore[attr-defined]
    p.run()          # reuses them
    for cell in ROUTES:  # SCALE = 2.0 -> 3.0, VALUE = 1 -> 3, 1.0 -> 3.0
        path = p.file(cell)
        path.write_text(path.read_text().replace("2.0", "3.0").replace("1", "3"))
    p.run()          # every route changed
    return p


def test_every_route_is_in_its_cells_observed_set(project: Project) -> None:
    """Each cell's entry holds the content hash of its own route's file as the first run
    read it: a change of that file alone makes the lookup miss (the third run below edits
    every route at once, so there a later cell may also rerun for an earlier cell's)."""
    stored = project.stored  # type: ignore[attr-defined]
    for cell in ROUTES:
        assert cell in stored, f"{cell}'s pass was not stored"
        # Entries name paths against the project's and the venv's folders (portable).
        anchors = Anchors.of(project=str(project.dir), prefix=str(project.venv))
        reads = {anchors.local(p): h for p, h in stored[cell]["reads"].items()}
        path = str(project.file(cell))
        rel = ROUTES[cell].replace("SITE/", "site/")
        original = (RES / "observed_project" / rel).read_bytes()
        assert reads.get(path) == "sha256:" + hashlib.sha256(original).hexdigest(), \
            (cell, sorted(reads))


def test_unchanged_passes_are_reused(project: Project) -> None:
    first, second = project.runs[0], project.runs[1]
    for cell in ROUTES:
        assert first[cell]["status"] == "passed", (cell, first[cell])
        assert second[cell]["status"] == "cached", (cell, second[cell])


def test_a_change_of_any_route_reruns_its_cells(project: Project) -> None:
    third = project.runs[2]
    for cell in ROUTES:
        assert third[cell]["status"] == "failed", (cell, third[cell]["status"])
        # It failed on the changed value: it ran the new code, read the new data.
        assert " 3" in third[cell]["failures"][0]["message"], third[cell]["failures"]


def test_a_pass_that_needed_a_retry_is_never_cached(project: Project) -> None:
    first, second = project.runs[0], project.runs[1]
    assert first["retried"]["status"] == "flaky" and first["retried"]["attempts"] == 2
    assert "retried" not in project.stored  # type: ignore[attr-defined]
    # The next run finds nothing stored for it: it runs (and passes the first time).
    assert second["retried"]["status"] == "passed"


def test_every_cpmatrix_module_a_world_loaded_is_in_the_static_key(project: Project) -> None:
    """Row 5, seen from the worlds: every cpmatrix file a rank had loaded is in the
    runtime digest's closure (so a wheel install, whose files are in a RECORD and not
    observed, is still covered by the static pre-key)."""
    keys = ActionKeys(search_path=())
    closure = {path for entry in WORKER_ENTRIES
               for path in keys.closure_sources(entry).values()}
    package = str(PACKAGE_DIR) + "/"
    loaded = {path for entry in project.stored.values()  # type: ignore[attr-defined]
              for path in entry["reads"] if path.startswith(package) and path.endswith(".py")}
    assert loaded, "the editable cpmatrix's own files are observed"
    assert loaded <= closure, sorted(loaded - closure)
