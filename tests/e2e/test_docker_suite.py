"""The reference suite through the docker runner: a few cells, a 2x2 one included, pass
in a `--network=none` container built from docker/cpu.Dockerfile (CI builds the image)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_runner import run_cli
from cpmatrix.matrix.load import load_matrix
from cpmatrix.supervise.runners import get_runner

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
    proc = run_cli("run", "--matrix", str(ROOT / "matrix" / "parity.yaml"), "-k", SELECTION,
                   "--runner", "docker", "--out", str(out), "--plain", "--no-cache",
                   timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("runner: docker")
    results = json.loads((out / "results.json").read_text())
    assert len(results) >= 3 and all(r["status"] == "passed" for r in results)
    assert any(",2x2," in r["cell_id"] for r in results)
    # The worlds really ran in a container: the command each world ran is docker's.
    for command in (out / "worlds").glob("*/command.json"):
        argv = json.loads(command.read_text())["argv"]
        assert Path(argv[0]).name == "docker" and "--network=none" in argv


def _tag(source: str, name: str) -> None:
    subprocess.run(["docker", "tag", source, name], check=True, capture_output=True)


@pytest.mark.slow
@pytest.mark.docker
def test_a_users_own_image_reference_runs_its_cells(tmp_path: Path) -> None:
    """A project outside this checkout names an image it built (here: ours, re-tagged);
    its id is in the cache key: the same name on another image is not a cache hit."""
    if shutil.which("docker") is None:
        pytest.skip("docker is not installed")
    runner = get_runner("docker", _CPU, ROOT / "matrix")
    why = runner.unavailable()
    assert why is None, f"docker installed but unusable (CI builds the image): {why}"
    name = f"cpmatrix-test/user-parity:{tmp_path.name.lower()}"
    _tag(runner.image, name)  # type: ignore[attr-defined]
    try:
        project = tmp_path / "project"
        project.mkdir()
        (project / "cases.py").write_text(
            "import torch, torch.distributed as dist\n\n"
            "def allreduce(cell):\n"
            "    x = torch.ones(3, dtype=cell.dtype)\n"
            "    dist.all_reduce(x)\n"
            "    assert float(x[0]) == cell.world_size\n")
        matrix = project / "matrix.yaml"
        matrix.write_text(
            "version: 1\npythonpath: [.]\nplatforms:\n"
            f"  cpu: {{backend: gloo, device: cpu, image: '{name}'}}\n"
            "targets:\n  - {name: allreduce, case: 'cases:allreduce', level: unit, "
            "axes: {mesh: [1x2]}}\n")

        def run(out: str) -> subprocess.CompletedProcess[str]:
            return run_cli("run", "--matrix", str(matrix), "--runner", "docker", "--out",
                           str(tmp_path / out), "--cache-dir", str(tmp_path / "cache"),
                           "--plain", timeout=600)

        first = run("a")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
        assert first.stdout.startswith("runner: docker") and "1 passed" in first.stdout
        assert "1 cached" in run("b").stdout
        # The same name on another image (the base: no torch): another key, a real run.
        _tag("cpmatrix-base:bookworm", name)
        third = run("c")
        # (the lookup line says "cache: 0 of 1 cells cached": the summary's count decides)
        assert "1 cached" not in third.stdout and "1 crash" in third.stdout, third.stdout[-3000:]
        assert third.returncode == 1
    finally:
        subprocess.run(["docker", "rmi", name], capture_output=True, check=False)
    missing = run("d")
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert f"docker pull {name}" in missing.stderr and "Traceback" not in missing.stderr
