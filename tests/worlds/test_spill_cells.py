"""Spill cells in the matrix: `cpmatrix spill` and `cpmatrix run` with the real Triton
compiler and ptxas (no GPU), in the same report as parity cells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_cli as cli
from cpmatrix.report import read_report

RES = Path(__file__).parents[1] / "resources"
FITS = "fits[unit,1x1,fp32,autocast=off,kernel,config=b1024,arch={arch}]@cpu"
CONTROL = "negative_control[unit,1x1,fp32,autocast=off,kernel,config=b8192,arch=sm_80]@cpu"
SPILLS = "spills[unit,1x1,fp32,autocast=off,kernel,config=b8192,arch=sm_80]@cpu"


def results(out: Path) -> dict[str, dict]:
    return {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}


@pytest.mark.slow
def test_spill_gate_passes_fits_fails_spills_and_caches(tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = cli("spill", "--matrix", str(RES / "spill.yaml"), "--out", str(out),
               "--cache-dir", str(cache), "--plain")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = results(out)
    assert set(got) == {FITS.format(arch="sm_80"), FITS.format(arch="sm_90a"), CONTROL, SPILLS}
    for arch in ("sm_80", "sm_90a"):
        r = got[FITS.format(arch=arch)]
        assert r["status"] == "passed"
        assert r["evidence"]["spill_store_bytes"] == 0 and r["evidence"]["registers"] > 0
    assert got[CONTROL]["status"] == "passed", "a declared negative control that spills passes"
    bad = got[SPILLS]
    assert bad["status"] == "failed"
    assert bad["evidence"]["spill_store_bytes"] > 0
    assert "> budget 0" in bad["message"] and "registers" in bad["message"]
    assert f"FAILED {SPILLS}" in proc.stdout
    # The report carries the numbers as properties.
    props = {c.name: c.properties for c in read_report(out / "report.xml")}
    assert int(props[SPILLS]["evidence.spill_load_bytes"]) > 0
    # Nothing changed: passes come from the result cache, and the failing cell is
    # re-gated from the compile cache (nothing compiles again).
    again = cli("spill", "--matrix", str(RES / "spill.yaml"), "--out", str(out),
                "--cache-dir", str(cache), "--plain")
    assert again.returncode == 1
    got = results(out)
    assert got[FITS.format(arch="sm_80")]["status"] == "cached"
    assert got[SPILLS]["status"] == "failed" and got[SPILLS]["evidence"]["cached"] is True


@pytest.mark.slow
def test_run_reports_spill_and_parity_cells_together(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = cli("run", "--matrix", str(RES / "spill.yaml"), "-k", "fits or parity",
               "--out", str(out), "--plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {c.name for c in read_report(out / "report.xml")}
    assert names == {FITS.format(arch="sm_80"), FITS.format(arch="sm_90a"),
                     "parity[unit,1x1,fp64,autocast=off,reference]@cpu"}


@pytest.mark.parametrize(
    ("block", "message", "where"),
    [
        ("      archs: [sm_80, sm_91]", "unknown arch 'sm_91'", "targets[0].spill.archs[1]"),
        ("      num_warps: 3", "num_warps 3 is not a power of two", "targets[0].spill.num_warps"),
        ("      table: T", "give exactly one of", "targets[0].spill"),
    ],
)
def test_bad_spill_blocks_exit_2(tmp_path: Path, block: str, message: str, where: str) -> None:
    base = (RES / "spill.yaml").read_text().split("  - name: negative_control")[0]
    text = base.replace("      archs: [sm_80, sm_90a]", block)
    path = tmp_path / "m.yaml"
    path.write_text(text.replace("pythonpath: [., cases]", f"pythonpath: [{RES}]"))
    proc = cli("list", "--matrix", str(path))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and where in proc.stderr and "Traceback" not in proc.stderr


def test_spill_block_needs_its_kind(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "version: 1\nplatforms: {cpu: {backend: gloo, device: cpu, image: x}}\ntargets:\n"
        f"  - {{name: a, case: 'spill_kernels:row_softmax', level: unit, spill: {{table: T}}}}\n"
        f"pythonpath: [{RES}]\n")
    proc = cli("list", "--matrix", str(path))
    assert proc.returncode == 2 and "needs kind: spill" in proc.stderr


@pytest.mark.slow
def test_reference_suite_kernels_pass_and_the_negative_control_is_real(tmp_path: Path) -> None:
    """Every suite kernel is declared in matrix/parity.yaml and compiles with 0 spills; the
    declared negative control passes only because it spills: gated as an ordinary kernel
    (expect_spill off), the same config fails with the numbers."""
    matrix = RES.parent.parent / "matrix" / "parity.yaml"
    out = tmp_path / "out"
    proc = cli("spill", "--matrix", str(matrix), "--out", str(out), "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = results(out)
    kernels = {r["evidence"]["entry"] for r in got.values()}
    assert kernels >= {"softmax_fwd_kernel", "softmax_bwd_kernel", "lse_merge_kernel",
                       "layer_norm_fwd_kernel", "layer_norm_bwd_kernel"}
    control = [r for cid, r in got.items() if cid.startswith("spill_negative_control")]
    assert len(control) == 1 and control[0]["evidence"]["spill_store_bytes"] > 0
    flipped = tmp_path / "parity.yaml"
    flipped.write_text(matrix.read_text().replace("      expect_spill: true\n", ""))
    proc = cli("spill", "--matrix", str(flipped), "-k", "spill_negative_control",
               "--out", str(tmp_path / "flipped"), "--plain", "--no-cache")
    assert proc.returncode == 1, proc.stdout
    (bad,) = results(tmp_path / "flipped").values()
    assert bad["status"] == "failed" and "> budget 0" in bad["message"]
