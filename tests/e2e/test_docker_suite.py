"""The reference suite through the docker runner: a few cells, a 2x2 one included, pass
in a `--network=none` container built from docker/cpu.Dockerfile (CI builds the image)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpmatrix.matrix.load import load_matrix
from cpmatrix.run.runners import get_runner

ROOT = Path(__file__).parents[2]
#: The platform whose image the docker runner runs (matrix/parity.yaml's cpu).
_CPU = load_matrix(ROOT / "matrix" / "parity.yaml").platform("cpu")
SELECTION = ("(ring_attention and 2x2 and fp64 and n=5) or (layernorm and 1x2 and fp64 and n=5)"
             " or (train_step_single and 1x1 and fp64)")


@pytest.mark.slow
@pytest.mark.docker
def test_suite_cells_pass_in_a_container(tmp_path: Path) -> None:
    if shutil.which("docker") is None:
        pytest.skip("docker is not installed")
    why = get_runner("docker", _CPU, ROOT / "matrix").unavailable()
    assert why is None, f"docker installed but unusable (CI builds the image): {why}"
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "cpmatrix", "run", "--matrix", str(ROOT / "matrix" / "parity.yaml"),
         "-k", SELECTION, "--runner", "docker", "--out", str(out), "--plain", "--no-cache"],
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("runner: docker")
    results = json.loads((out / "results.json").read_text())
    assert len(results) >= 3 and all(r["status"] == "passed" for r in results)
    assert any(",2x2," in r["cell_id"] for r in results)
    # The worlds really ran in a container: the command each world ran is docker's.
    for command in (out / "worlds").glob("*/command.json"):
        argv = json.loads(command.read_text())["argv"]
        assert Path(argv[0]).name == "docker" and "--network=none" in argv
