"""``python -m cpmatrix.spill.crosscheck``: which cells it checks, its lines, its exit codes.

The comparison itself needs a GPU: on a machine with one, the last test runs it for real
over the suite's sm_90a spill cells; without one it checks the clean refusal.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cpmatrix.spill.crosscheck import describe

ROOT = Path(__file__).parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton (pip install cpmatrix[kernels])")

LOADED: dict[str, Any] = {
    "loaded_n_regs": 32, "ptxas_registers": 32, "registers_match": True,
    "loaded_local_bytes": 0, "ptxas_stack_frame_bytes": 0, "local_memory_match": True,
    "ptxas_spill_store_bytes": 0, "ptxas_spill_load_bytes": 0, "match": True,
}


def crosscheck(*args: str, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cpmatrix.spill.crosscheck", *args],
                          capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    ("result", "ok", "line"),
    [
        (LOADED, True, "MATCH k: registers 32 loaded = 32 ptxas; local memory 0 B loaded = 0 B "
         "ptxas stack frame; ptxas spills 0 B stores + 0 B loads"),
        ({**LOADED, "loaded_n_regs": 40, "registers_match": False, "match": False}, False,
         "MISMATCH k: registers 40 loaded != 32 ptxas; local memory 0 B loaded = 0 B ptxas "
         "stack frame; ptxas spills 0 B stores + 0 B loads"),
        ({**LOADED, "loaded_local_bytes": 16, "local_memory_match": False, "match": False},
         False, "MISMATCH k: registers 32 loaded = 32 ptxas; local memory 16 B loaded != 0 B "
         "ptxas stack frame; ptxas spills 0 B stores + 0 B loads"),
        ({"error": "RuntimeError: out of resources"}, False,
         "ERROR k: RuntimeError: out of resources"),
        ({"skipped": "no CUDA device"}, False, "SKIPPED k: no CUDA device"),
    ],
)
def test_describe(result: dict[str, Any], ok: bool, line: str) -> None:
    assert describe("k", result) == (ok, line)


@needs_triton
def test_dry_run_lists_the_suite_spill_cells_of_the_arch() -> None:
    proc = crosscheck("--dry-run", "--arch", "sm_90a")
    assert proc.returncode == 0, proc.stderr
    ids = [ln.split()[0] for ln in proc.stdout.splitlines()[:-1]]
    assert [i.split("[")[0] for i in ids] == [
        "spill_softmax_fwd", "spill_softmax_bwd", "spill_lse_merge", "spill_layer_norm_fwd",
        "spill_layer_norm_bwd", "spill_negative_control"]
    assert all("arch=sm_90a" in i for i in ids)
    # The negative control's own config, not the table's default, is what gets loaded.
    assert "{'BLOCK': 65536}" in proc.stdout.splitlines()[5]
    assert proc.stdout.splitlines()[-1] == "crosscheck: would check 6 kernels for sm_90a"


def test_no_spill_cell_for_the_arch_exits_3() -> None:
    proc = crosscheck("--dry-run", "--arch", "sm_80", "-k", "negative_control")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no spill cell for sm_80" in proc.stderr and "archs: sm_90a" in proc.stderr


def test_refuses_the_interpreter() -> None:
    proc = crosscheck(env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 2
    assert "TRITON_INTERPRET is set" in proc.stderr


@needs_triton
def test_on_the_device_or_a_clean_refusal(tmp_path: Path) -> None:
    import torch

    out = tmp_path / "crosscheck.json"
    proc = crosscheck("--json", str(out), env={"TRITON_INTERPRET": "0"})
    if not torch.cuda.is_available():
        assert proc.returncode == 2
        assert "error: crosscheck needs a CUDA device: no CUDA device" in proc.stderr
        assert not out.exists()
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "crosscheck: 6/6 kernels match" in proc.stdout
    assert out.is_file()
