"""Hermetic runs end to end: what a cell sees through each runner, and `cpmatrix repro`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_runner import run_cli as cli
from cpmatrix.matrix.load import load_matrix
from cpmatrix.supervise.runners import get_runner

RES = Path(__file__).parents[1] / "resources"
ROOT = RES.parent.parent
#: The platform whose image the docker runner runs (matrix/parity.yaml's cpu).
_CPU = load_matrix(ROOT / "matrix" / "parity.yaml").platform("cpu")
CELL_2X2 = "interfaces[unit,2x2,fp64,autocast=off,reference]@cpu"


def unavailable(name: str) -> str | None:
    """Skip only when the runner's program is not installed; a runner that is installed
    but broken (no engine, no image, no namespaces) fails the test instead."""
    program = {"sandbox": "bwrap", "docker": "docker"}.get(name)
    if program and shutil.which(program) is None:
        return f"{program} is not installed"
    why = get_runner(name, _CPU, ROOT / "matrix").unavailable()
    if why:
        pytest.fail(f"{name} runner installed but unusable: {why}")
    return None


@pytest.mark.slow
@pytest.mark.parametrize(
    "runner", ["local", "sandbox", pytest.param("docker", marks=pytest.mark.docker)])
def test_cell_sees_only_loopback_in_sandbox_and_docker(runner: str, tmp_path: Path) -> None:
    why = unavailable(runner)
    if why:
        pytest.skip(f"{runner} runner unavailable here: {why}")
    out = tmp_path / "out"
    proc = cli("run", "--matrix", str(RES / "hermetic.yaml"), "--runner", runner,
               "--out", str(out), "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"runner: {runner}")
    results = {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}
    assert len(results) == 2
    for r in results.values():
        seen = r["evidence"]["interfaces"]
        if runner == "local":
            assert "lo" in seen.split(",")
        else:
            assert seen == "lo", f"{runner}: a cell must see only loopback, saw {seen}"


@pytest.mark.slow
def test_repro_reruns_one_cell_bit_identically(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = cli("run", "--matrix", str(RES / "hermetic.yaml"), "--out", str(out), "--plain",
               "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}[CELL_2X2]
    repro = cli("repro", CELL_2X2, "--matrix", str(RES / "hermetic.yaml"),
                "--out", str(tmp_path / "repro"))
    assert repro.returncode == 0, repro.stdout + repro.stderr
    # It prints the line to paste and the full command it ran, and streams the ranks.
    assert f"repro: cpmatrix repro '{CELL_2X2}'" in repro.stdout
    assert "$ " in repro.stdout and "-m cpmatrix.worker.forkrun" in repro.stdout  # the launcher
    # fp64 evidence is bit-identical to the run the id came from.
    checksum = first["evidence"]["checksum"]
    assert f"evidence checksum = {checksum!r}" in repro.stdout


def test_repro_of_an_unknown_cell_exits_3(tmp_path: Path) -> None:
    proc = cli("repro", "interfaces[unit,3x3,fp64,autocast=off,reference]@cpu",
               "--matrix", str(RES / "hermetic.yaml"), "--out", str(tmp_path))
    assert proc.returncode == 3 and "no cell" in proc.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_repro_in_docker_matches_the_local_run(tmp_path: Path) -> None:
    why = unavailable("docker")
    if why:
        pytest.skip(why)
    local = cli("repro", CELL_2X2, "--matrix", str(RES / "hermetic.yaml"),
                "--out", str(tmp_path / "a"))
    in_docker = cli("repro", CELL_2X2, "--matrix", str(RES / "hermetic.yaml"),
                    "--runner", "docker", "--out", str(tmp_path / "b"))
    assert local.returncode == 0 and in_docker.returncode == 0, in_docker.stdout[-3000:]
    ran = [ln for ln in in_docker.stdout.splitlines() if ln.startswith("$ ")]
    assert ran and "docker run --rm --init --network=none" in ran[0], ran
    line = [ln for ln in local.stdout.splitlines() if ln.startswith("evidence checksum")]
    assert line and line[0] in in_docker.stdout
