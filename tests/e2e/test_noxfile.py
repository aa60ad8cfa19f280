"""The nox sessions, through the real nox CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).parents[2]
RES = Path(__file__).parents[1] / "resources"


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


#: The Triton versions `nox -s compat` tests: the newest patch of each minor release on the
#: package index from 3.6 on. Frozen here so the tested range only changes on purpose.
TESTED_TRITON = ["3.6.0", "3.7.1", "3.8.0", "3.9.0"]


def test_a_compat_session_per_tested_triton_and_pyproject_admits_exactly_those() -> None:
    proc = nox("-l")
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^[*-] compat\(triton='([^']+)'\) -> \S", proc.stdout, re.MULTILINE)
    assert listed == TESTED_TRITON, proc.stdout
    # The kernels extra states the tested range: every tested version is in it, and the
    # versions just outside (the minor release below, the next minor) are not.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (spec,) = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["kernels"]
               if Requirement(r).name == "triton"]
    assert all(spec.specifier.contains(v) for v in TESTED_TRITON), spec
    lowest, newest = Version(TESTED_TRITON[0]), Version(TESTED_TRITON[-1])
    below = f"{lowest.major}.{lowest.minor - 1}.99"
    above = f"{newest.major}.{newest.minor + 1}.0"
    assert not spec.specifier.contains(below) and not spec.specifier.contains(above), spec


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
