"""A ``pytest:`` target's data read while the ranks import the test modules (issue 29,
cause 9): a golden file loaded at module level is in each cell's observed set, so editing
it reruns the cell instead of returning a cached pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cli_runner import run_cli

pytestmark = pytest.mark.slow

MATRIX = """\
version: 1
platforms:
  cpu: {backend: gloo, device: cpu}
targets:
  - name: golden
    pytest: [test_golden.py]
    timeout: 120
"""

TEST = '''\
from pathlib import Path

import pytest
import torch.distributed as dist

# Read at import, while the ranks build their pytest session: before any cell starts.
GOLDEN = (Path(__file__).parent / "golden" / "expected.txt").read_text().strip()


@pytest.mark.world(2)
def test_matches_the_golden_file():
    assert dist.get_world_size() == 2
    assert GOLDEN == "ok", "planted: the golden file changed"
'''


def _statuses(out: Path) -> list[str]:
    return [r["status"] for r in json.loads((out / "results.json").read_text())]


def _runs(suite: Path, tmp_path: Path) -> Callable[[str], tuple[int, list[str], str]]:
    """``cpmatrix run`` of the suite's matrix into ``tmp_path/<name>``, one cache for all:
    its exit code, the cells' statuses, and its output with the launchers' logs."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache-home")}

    def run(name: str) -> tuple[int, list[str], str]:
        out = tmp_path / name
        proc = run_cli("run", "--matrix", str(suite / "m.yaml"), "--out", str(out),
                       "--plain", env=env)
        log = "".join(p.read_text() for p in out.glob("worlds/*/torchrun.log"))
        return proc.returncode, _statuses(out), proc.stdout[-3000:] + proc.stderr[-2000:] + log

    return run


def test_a_file_read_at_import_is_observed(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    (suite / "golden").mkdir(parents=True)
    (suite / "golden" / "expected.txt").write_text("ok\n")
    (suite / "test_golden.py").write_text(TEST)
    (suite / "m.yaml").write_text(MATRIX)
    run = _runs(suite, tmp_path)
    rc, statuses, text = run("first")
    assert (rc, statuses) == (0, ["passed"]), text
    rc, statuses, text = run("again")
    assert (rc, statuses) == (0, ["cached"]), text
    (suite / "golden" / "expected.txt").write_text("changed\n")
    rc, statuses, text = run("edited")
    assert (rc, statuses) == (1, ["failed"]), text


MATRIX_SITE = MATRIX + "pythonpath: [site]\n"

INSTALLED_TEST = '''\
import pytest
import cpmx_obs_installed
import torch.distributed as dist


@pytest.mark.world(2)
def test_matches_the_installed_data():
    assert dist.get_world_size() == 2
    assert cpmx_obs_installed.VALUE == "ok", "planted: the data file changed"
'''


def test_a_file_read_by_an_installed_module_imported_before_the_fork_is_observed(
    tmp_path: Path,
) -> None:
    # The fork launcher imports the installed modules a test file imports first, once,
    # before the ranks exist (kinds/pytest/preload.py): what they read is still every
    # cell's input.
    suite = tmp_path / "suite"
    pkg = suite / "site" / "cpmx_obs_installed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        "VALUE = (Path(__file__).parent.parent / 'cpmx_obs_data' / 'value.txt')"
        ".read_text().strip()\n")
    info = suite / "site" / "cpmx_obs_installed-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cpmx_obs_installed\n"
                                   "Version: 1.0\n")
    (info / "RECORD").write_text("cpmx_obs_installed/__init__.py,,\n"
                                 "cpmx_obs_installed-1.0.dist-info/METADATA,,\n"
                                 "cpmx_obs_installed-1.0.dist-info/RECORD,,\n")
    data = suite / "site" / "cpmx_obs_data" / "value.txt"
    data.parent.mkdir()
    data.write_text("ok\n")
    (suite / "test_golden.py").write_text(INSTALLED_TEST)
    (suite / "m.yaml").write_text(MATRIX_SITE)
    run = _runs(suite, tmp_path)
    rc, statuses, text = run("first")
    assert (rc, statuses) == (0, ["passed"]), text
    assert "imported 1 installed modules" in text or "imported 2 installed modules" in text
    rc, statuses, text = run("again")
    assert (rc, statuses) == (0, ["cached"]), text
    data.write_text("changed\n")
    rc, statuses, text = run("edited")
    assert (rc, statuses) == (1, ["failed"]), text
