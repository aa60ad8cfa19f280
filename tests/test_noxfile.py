"""The nox sessions, through the real nox CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
RES = Path(__file__).parent / "resources"


def nox(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args],
                          capture_output=True, text=True, timeout=600, check=False,
                          cwd=ROOT, env={**os.environ, **env})


def test_sessions_are_listed_with_descriptions() -> None:
    proc = nox("-l", CPMATRIX_MATRIX=str(RES / "runtime.yaml"))
    assert proc.returncode == 0, proc.stderr
    for name in ("parity-cpu", "parity-cuda", "spill", "mutants", "tests", "lint", "report",
                 "gate", "mutation"):
        line = next((ln for ln in proc.stdout.splitlines() if f" {name} -> " in ln), None)
        assert line is not None, (name, proc.stdout)
        assert len(line.split(" -> ", 1)[1]) > 10, line


def test_parity_cuda_without_a_device_exits_2_at_once() -> None:
    proc = nox("-s", "parity-cuda", CPMATRIX_MATRIX=str(RES / "runtime.yaml"),
               CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "no CUDA device is visible" in out and "Traceback" not in out


@pytest.mark.slow
def test_parity_cpu_says_its_runner_first_and_passes_a_selection(tmp_path: Path) -> None:
    proc = nox("-s", "parity-cpu", "--", "-k", "allreduce and 1x2", "--no-cache",
               CPMATRIX_MATRIX=str(RES / "runtime.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = [ln for ln in proc.stderr.splitlines()
            if ln.startswith("nox > ") and "uv binary" not in ln]
    assert logs[1].startswith("nox > runner: "), logs  # after nox's "Running session"
    assert "1 cells: 1 passed" in proc.stdout
    assert "merged report:" in logs[-2] or any("merged report:" in ln for ln in logs)
