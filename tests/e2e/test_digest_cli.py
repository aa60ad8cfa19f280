"""Digests across processes: ``cpmatrix list --json`` in fresh interpreters (other hash
seeds, other working folders, the console script) gives the ids and digests this process
computes. The in-process digest tests are ``tests/unit/test_digest.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from cli_runner import RES, run_cli
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix

GRID = RES / "grid.yaml"


def list_json(script: str | None, matrix_file: Path, cwd: Path,
              hashseed: str) -> list[dict]:  # type: ignore[type-arg]
    """``cpmatrix list --json`` through ``python -m cpmatrix`` or, given, the console
    script (which puts another folder on ``sys.path``)."""
    argv = ("list", "--json", "--matrix", str(matrix_file))
    env = {"PYTHONHASHSEED": hashseed}
    if script is None:
        proc = run_cli(*argv, cwd=cwd, env=env, timeout=120)
    else:
        proc = subprocess.run([script, *argv], capture_output=True, text=True, cwd=cwd,
                              env={**os.environ, **env}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(proc.stdout)
    assert isinstance(cells, list)
    return cells


def test_ids_and_digests_agree_across_processes_and_hash_seeds(tmp_path: Path) -> None:
    here = [(c.id, c.digest) for c in expand(load_matrix(GRID)).cells]
    runs: list[tuple[str | None, Path, str]] = [(None, tmp_path, "0"), (None, RES, "4242")]
    script = shutil.which("cpmatrix")
    if script is not None:  # the console script puts a different directory on sys.path
        runs.append((script, tmp_path, "random"))
    seen = []
    for via, cwd, seed in runs:
        cells = list_json(via, GRID, cwd, seed)
        seen.append([(c["id"], c["digest"]) for c in cells])
    assert all(s == here for s in seen)
    assert len({d for _, d in here}) == len(here)  # every cell has its own digest
