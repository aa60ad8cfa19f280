"""``scripts/gpu-check.sh`` without a GPU: its syntax, its prerequisite checks, the wheels
fallback for junitparser, its summary, and a rehearsal of every step on the cpu platform.

What only a GPU can show (nccl worlds, compiled kernels, the loaded-kernel cross-check) is
the script's own job on a GPU host; see docs/gpu.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix
from script_modules import load_script

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def gpu_check(*args: str, tmp_path: Path, path_first: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The script from the repository root, with this interpreter as its python3."""
    base = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    if path_first is not None:
        base["PATH"] = f"{path_first}{os.pathsep}{base['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "out"), *args],
                          cwd=ROOT, env=base, capture_output=True, text=True, timeout=900,
                          check=False)


def fake_nvidia_smi(folder: Path, listing: str | None) -> Path:
    """An ``nvidia-smi`` that lists ``listing`` (None: fails as without a driver)."""
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    body = (f"printf '%s\\n' '{listing}'" if listing is not None else
            "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            "driver.\"; exit 9")
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return folder


def cpu_only_torch() -> bool:
    import torch

    return torch.version.cuda is None


def test_syntax() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        # CI installs it (.ci/install) and sets the variable: there, missing is a failure.
        if os.environ.get("CPMATRIX_REQUIRE_SHELLCHECK") == "1":
            pytest.fail("shellcheck is missing but CPMATRIX_REQUIRE_SHELLCHECK=1 (.ci/install)")
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("bad", [["--bogus"], ["--wheels"]])
def test_bad_options_exit_2(bad: list[str], tmp_path: Path) -> None:
    proc = gpu_check(*bad, tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpu-check: ")


def test_a_missing_gpu_is_named_and_nothing_runs(tmp_path: Path) -> None:
    proc = gpu_check(tmp_path=tmp_path, path_first=fake_nvidia_smi(tmp_path / "bin", None))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "gpu-check: missing prerequisites (nothing was run):"
    assert lines[1].startswith("  - a GPU: nvidia-smi -L lists none (NVIDIA-SMI has failed")
    if cpu_only_torch():
        assert any(ln.startswith("  - torch with CUDA: torch ")
                   and ln.endswith("is a CPU-only build") for ln in lines), lines
        assert any(ln.startswith("  - nccl: ") for ln in lines)
    assert not (tmp_path / "out").exists()


def test_a_listed_gpu_is_not_reported_missing(tmp_path: Path) -> None:
    bin_dir = fake_nvidia_smi(tmp_path / "bin", "GPU 0: NVIDIA H200 (UUID: GPU-fake)")
    proc = gpu_check(tmp_path=tmp_path, path_first=bin_dir)
    if not cpu_only_torch():
        pytest.skip("torch has CUDA here: the script would run, not stop at its checks")
    assert proc.returncode == 2
    assert "nvidia-smi" not in proc.stderr and "a GPU:" not in proc.stderr
    assert "is a CPU-only build" in proc.stderr


def hide_junitparser(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with a ``junitparser`` that cannot be imported (as on the GPU host)."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "junitparser.py").write_text("raise ImportError('hidden by the test')\n")
    return {"PYTHONPATH": str(block)}


def stub_wheel(folder: Path) -> Path:
    """A pure-Python wheel that provides an importable ``junitparser``."""
    folder.mkdir()
    name = "junitparser-99.0"
    wheel = folder / f"{name}-py3-none-any.whl"
    files = {
        "junitparser.py": "STUB = True\n",
        f"{name}.dist-info/METADATA": "Metadata-Version: 2.1\nName: junitparser\nVersion: 99.0\n",
        f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                   "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{name}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{name}.dist-info/RECORD", record)
    return folder


def test_junitparser_missing_without_wheels_is_named(tmp_path: Path) -> None:
    proc = gpu_check(tmp_path=tmp_path, env=hide_junitparser(tmp_path),
                     path_first=fake_nvidia_smi(tmp_path / "bin", None))
    assert proc.returncode == 2
    assert ("  - junitparser: not importable; pass --wheels DIR with junitparser-*.whl "
            "(see --help)") in proc.stderr.splitlines()


def test_junitparser_comes_from_the_wheels_folder(tmp_path: Path) -> None:
    wheels = stub_wheel(tmp_path / "wheels")
    proc = gpu_check("--wheels", str(wheels), tmp_path=tmp_path, env=hide_junitparser(tmp_path),
                     path_first=fake_nvidia_smi(tmp_path / "bin", None))
    assert proc.returncode == 2  # the GPU is still missing
    assert f"gpu-check: junitparser installed from {wheels}" in proc.stdout
    assert "junitparser" not in proc.stderr


def test_junitparser_not_in_the_wheels_folder_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = gpu_check(tmp_path=tmp_path, env={**hide_junitparser(tmp_path),
                                             "GPU_CHECK_WHEELS": str(empty)},
                     path_first=fake_nvidia_smi(tmp_path / "bin", None))
    assert proc.returncode == 2
    assert f"  - junitparser: pip could not install it from {empty}: " in proc.stderr


def test_the_world_matrix_has_one_trivial_cell_per_backend() -> None:
    matrix = load_matrix(ROOT / "scripts" / "gpu_check" / "world.yaml")
    assert {p.name: p.backend for p in matrix.platforms} == {"cpu": "gloo", "cuda": "nccl"}
    cells = expand(matrix).cells
    assert [(c.platform, c.world_size) for c in cells] == [("cpu", 1), ("cuda", 1)]


# --- the summary ------------------------------------------------------------------------

def summarize_module() -> ModuleType:
    return load_script("scripts/gpu_check/summarize.py", "gpu_check_summarize")


def fake_out(out: Path, steps: dict[str, int]) -> Path:
    """The files the script's steps leave, with made-up figures."""
    def results(step: str, rows: list[tuple[str, str, float]]) -> None:
        (out / step).mkdir(parents=True)
        (out / step / "results.json").write_text(json.dumps(
            [{"cell_id": i, "status": s, "duration_s": d} for i, s, d in rows]))

    out.mkdir()
    (out / "steps.tsv").write_text("".join(f"{k}\t{rc}\t{s}\n" for (k, rc), s in zip(
        steps.items(), (30.0, 20.0, 10.0, 12.0, 25.0, 6.25, 4.5), strict=False)))
    results("cuda-1x1", [("a[unit,1x1,fp32,autocast=off,kernel]@cuda", "passed", 1.0),
                         ("b[unit,1x1,fp64,autocast=off,reference]@cuda", "passed", 1.0),
                         ("c[unit,1x1,fp32,autocast=off,reference]@cuda", "failed", 1.0)])
    results("spill-gate", [("s1", "passed", 1.0), ("s2", "passed", 1.0)])
    results("timing-compiled", [("a", "passed", 3.0), ("b", "passed", 1.0)])
    results("timing-interpreted", [("a", "passed", 10.0), ("b", "passed", 2.0)])
    (out / "crosscheck.json").write_text(json.dumps(
        {"matched": 6, "total": 6, "device": "NVIDIA H200", "arch": "sm_90a"}))
    return out


STEPS = {"cuda-1x1": 1, "spill-gate": 0, "crosscheck": 0, "timing-compiled": 0,
         "timing-interpreted": 0, "world-nccl": 0, "world-gloo": 0}


def test_summary_line_and_exit(tmp_path: Path) -> None:
    summarize = summarize_module()
    out = fake_out(tmp_path / "out", STEPS)
    assert summarize.main([str(out)]) == 1
    line = (out / "summary.txt").read_text().strip()
    assert line == (
        "gpu-check: 2 cuda cells passed, 1 failed; spill crosscheck: 6/6 kernels match on "
        "NVIDIA H200 (sm_90a); ptxas gate 2/2 passed; compiled vs interpreted: 4.0 s vs "
        "12.0 s (3.0x, 2 vs 2 kernel cells); nccl world start: 6.2 s (gloo: 4.5 s); "
        "FAILED: cuda-1x1 (exit 1)")
    figures = json.loads((out / "summary.json").read_text())
    assert figures["timing"]["compiled_without_first_s"] == 1.0
    assert figures["cuda_cells"] == {"passed": 2, "failed": 1, "skipped": 0}


def test_summary_passes_only_when_every_required_step_ran_green(tmp_path: Path) -> None:
    summarize = summarize_module()
    green = fake_out(tmp_path / "green", {**STEPS, "cuda-1x1": 0})
    assert summarize.main([str(green)]) == 0
    assert "FAILED" not in (green / "summary.txt").read_text()
    no_world = fake_out(tmp_path / "no-world", {k: 0 for k in STEPS if k != "world-nccl"})
    assert summarize.main([str(no_world)]) == 1
    assert (no_world / "summary.txt").read_text().strip().endswith(
        "nccl world start: not run; FAILED: world-nccl (not run)")


# --- a rehearsal of every step, on the cpu platform ----------------------------------------

@pytest.mark.slow
def test_rehearsal_runs_every_step_and_exports_what_the_device_tool_takes(
        tmp_path: Path) -> None:
    export = tmp_path / "export"
    proc = gpu_check("--rehearse", "--quick", "--export", str(export), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    out = tmp_path / "out"
    steps = [ln.split("\t")[0] for ln in (out / "steps.tsv").read_text().splitlines()]
    assert steps == ["cuda-1x1", "spill-gate", "crosscheck", "world-nccl", "world-gloo"]
    line = (out / "summary.txt").read_text().strip()
    assert line.startswith("gpu-check REHEARSAL (cpu platform, no GPU): 8 cpu cells passed, "
                           "0 failed; spill crosscheck: kernels listed only (rehearsal); "
                           "ptxas gate 6/6 passed; compiled: "), line
    assert proc.stdout.splitlines()[-2] == line
    # The device tool brings back at most 8 plain files with plain names.
    names = sorted(p.name for p in export.iterdir())
    assert names == ["env.txt", "gpu-check.log", "reports.tar.gz", "summary.json",
                     "summary.txt"]
    with tarfile.open(export / "reports.tar.gz") as tar:
        members = tar.getnames()
    assert "cuda-1x1/results.json" in members and "world-nccl/report.xml" in members
    assert not any("/home/" in m for m in members)
