"""``matrix/parity.yaml`` and the reference suite's cases, through the real CLI.

(a) the matrix's shape (no torchrun): >= 150 cpu cells over the four levels and the
    property, every mesh, dtype, autocast and path, a ``release`` tag, single-element and
    padded sizes, every case declaring mutants that the suite plants; the cuda platform
    plans (``--dry-run``);
(b) a real run of a representative selection in one 2-rank world (the fp64 oracle cells
    of every target on 1x2, a Triton-kernel cell, the property cell on 2x1): green, with
    the toolkit's evidence, and the RNG fingerprints re-checked here, after the join;
(c) ``--mutants`` on the 2x2 fp64 cells of every target: every planted bug of the suite
    (and the property case's) is killed by a toolkit check; and a case that forgets to
    compare makes its mutant survive and the run fail.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from cpmatrix.parity import CHECKS, assert_entropy, declared_mutants, load_fingerprints
from cpmatrix.suite import MUTANTS
from world_runs import Run, read_run

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "matrix" / "parity.yaml"
LEVELS = {"unit", "layer", "module", "workflow"}
MESHES = {"1x1", "1x2", "2x2", "2x3", "3x3"}

#: (b): every target's fp64 cells on 1x2, one kernel cell, the property cell. One world.
FAST = ("(1x2 and fp64) or (ring_attention_kernel and 1x2 and fp32 and autocast=off) "
        "or (diffusion_noise and 2x1 and fp64)")
#: (c): the 2x2 fp64 cells of every target (n=7): together they plant every suite mutant.
MUTANT_SELECTION = "(2x2 and fp64 and n=7) or (diffusion_noise and 2x2 and fp64)"


def cpmatrix(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run_cli(*argv, timeout=timeout, cwd=ROOT)  # the default matrix: matrix/parity.yaml


@pytest.fixture(scope="module")
def cells() -> list[dict[str, Any]]:
    proc = cpmatrix("list", "--matrix", str(MATRIX), "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    return found


# ------------------------------------------------------------------------------ (a) shape

def test_at_least_150_cpu_cells_over_every_level_and_the_property(
    cells: list[dict[str, Any]],
) -> None:
    cpu = [c for c in cells if c["platform"] == "cpu"]
    assert len(cpu) >= 150, len(cpu)
    assert {c["level"] for c in cpu} == LEVELS
    assert any(c["kind"] == "property" for c in cpu)
    parity_levels = {c["level"] for c in cpu if c["kind"] == "parity"}
    assert parity_levels == LEVELS


def test_every_axis_value_is_covered(cells: list[dict[str, Any]]) -> None:
    cpu = [c for c in cells if c["platform"] == "cpu"]
    assert {c["mesh"] for c in cpu} >= MESHES
    assert {c["dtype"] for c in cpu} == {"fp64", "fp32", "bf16"}
    assert {c["autocast"] for c in cpu} == {True, False}
    assert {c["path"] for c in cpu} == {"reference", "kernel"}
    # every level has its fp64 oracle on every mesh (1x1 through the *_single targets)
    for level in LEVELS:
        meshes = {c["mesh"] for c in cpu if c["level"] == level and c["dtype"] == "fp64"}
        assert meshes >= MESHES, (level, meshes)
    # 3x3 is present but kept few (its world is the slow one)
    assert 0 < sum(c["mesh"] == "3x3" for c in cpu) <= 10


def test_release_tag_marks_the_oracle_and_small_kernel_cells(
    cells: list[dict[str, Any]],
) -> None:
    cpu = [c for c in cells if c["platform"] == "cpu"]
    release = [c for c in cpu if "release" in c["tags"]]
    assert release and len(release) < len(cpu)
    # every fp64 reference cell is a release cell
    assert all("release" in c["tags"] for c in cpu
               if c["dtype"] == "fp64" and c["path"] == "reference")
    kernels = [c for c in release if c["path"] == "kernel"]
    assert kernels and {c["mesh"] for c in kernels} <= {"1x1", "1x2", "2x2"}
    assert {c["level"] for c in release} == LEVELS


def test_awkward_sizes_pad_and_reach_single_element_shards(
    cells: list[dict[str, Any]],
) -> None:
    ids = {c["id"] for c in cells}
    # 5 tokens on 2x3 (6 slots over the flattened mesh): one token per rank, one rank
    # holds only padding; 7 on 3x3: one per rank; 2 rows on 1x2: one per shard
    for cell_id in ("ring_attention[unit,2x3,fp64,autocast=off,reference,n=5]@cpu",
                    "ring_attention[unit,3x3,fp64,autocast=off,reference,n=7]@cpu",
                    "collectives[unit,1x2,fp64,autocast=off,reference,n=2]@cpu"):
        assert cell_id in ids
    # the token count divides no multi-rank mesh: every module/workflow cell pads
    for c in cells:
        if c["level"] in ("module", "workflow") and c["world_size"] > 1:
            assert int(c["params"]["n"]) % c["world_size"] != 0, c["id"]


def test_every_case_declares_mutants_the_suite_plants(cells: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    # spill cells name a Triton kernel, not a case: they are gated by ptxas, not mutants
    for ref in sorted({c["case"] for c in cells if c["kind"] != "spill"}):
        module, _, name = ref.partition(":")
        declared = declared_mutants(getattr(importlib.import_module(module), name))
        assert declared, f"{ref} declares no mutant"
        if not ref.endswith("property:diffusion_noise"):  # its bugs live in the case
            assert set(declared) <= set(MUTANTS), (ref, declared)
        seen |= set(declared)
    # every planted bug of the suite has a case that must kill it
    assert set(MUTANTS) <= seen, sorted(set(MUTANTS) - seen)


def test_cuda_platform_plans() -> None:
    proc = cpmatrix("run", "--matrix", str(MATRIX), "--platform", "cuda", "--dry-run",
                    timeout=120)
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()[0]
    assert re.match(r"plan: \d+ cells in 1 worlds", head), head  # one per platform
    assert "@cuda" in proc.stdout and "@cpu" not in proc.stdout


# ------------------------------------------------------------------------------ runs

def _run(out: Path, *argv: str) -> Run:
    proc = cpmatrix("run", "--platform", "cpu", "--out", str(out), "--plain", "--no-cache",
                    *argv)
    return read_run(out, proc.returncode, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield _run(tmp_path_factory.mktemp("suite_fast"), "--matrix", str(MATRIX), "-k", FAST)


@pytest.fixture(scope="module")
def mutant_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield _run(tmp_path_factory.mktemp("suite_mutants"), "--matrix", str(MATRIX),
               "-k", MUTANT_SELECTION, "--mutants")


def _checks(evidence: dict[str, Any]) -> dict[str, str]:
    """``{label.check: text}`` of the toolkit's per-check evidence lines."""
    return {k.split(".check.")[0] + "." + k.split(".check.")[1]: str(v)
            for k, v in evidence.items() if ".check." in k}


@pytest.mark.slow
def test_representative_selection_passes_with_evidence(fast_run: Run) -> None:
    assert fast_run.returncode == 0, fast_run.stdout
    plain = fast_run.plain()
    targets = {r["cell_id"].split("[")[0] for r in plain}
    assert {"collectives", "pair_transpose", "ring_attention", "layernorm", "attention_layer",
            "pair_block", "train_step", "ring_attention_kernel", "diffusion_noise"} <= targets
    for r in plain:
        assert r["status"] == "passed", (r["cell_id"], r["failures"])
        checks = _checks(r["evidence"])
        if r["cell_id"].startswith("diffusion_noise"):
            assert "2/2 ranks exercised" in r["evidence"]["rng.coord_noise"]
            continue
        assert checks, r["cell_id"]
        for name, text in checks.items():
            assert text.startswith(("ok", "skipped")), (r["cell_id"], name, text)
        # on 1x2 every comparison ran with sharding active and the tolerance of the table
        assert all(t.startswith("ok") for n, t in checks.items()
                   if n.endswith(".sharding_active")), r["cell_id"]
        assert all("table fp" in t for n, t in checks.items() if n.endswith(".tolerance"))


@pytest.mark.slow
def test_zero_init_projection_was_perturbed(fast_run: Run) -> None:
    r = next(r for r in fast_run.plain() if r["cell_id"].startswith("attention_layer[layer,1x2"))
    assert "attn.o.weight" in r["evidence"]["attention.perturbed"]


@pytest.mark.slow
def test_rng_fingerprints_hold_after_the_join(fast_run: Run) -> None:
    # the property, re-asserted in this (parent) process from the per-rank files
    r = next(r for r in fast_run.plain() if r["cell_id"].startswith("diffusion_noise"))
    prints = load_fingerprints(fast_run.out / "cells" / r["cell_id"])
    assert len(prints) == 2
    report = assert_entropy(prints, sharded=("cp0",), replicated=("cp1",),
                            labels=("coord_noise",), min_numel=64)
    assert report.ranks_exercised == 2 and report.disjoint_pairs >= 1


@pytest.mark.slow
def test_every_planted_bug_is_killed_by_a_toolkit_check(mutant_run: Run) -> None:
    assert mutant_run.returncode == 0, mutant_run.stdout
    runs = [r for r in mutant_run.results if r["mutant"]]
    killed = [r for r in runs if r["evidence"].get("mutant_outcome") == "killed"]
    assert f"mutants: {len(runs)}/{len(runs)} killed (kill rate 100.0%)" in mutant_run.stdout
    assert len(killed) == len(runs)
    assert set(MUTANTS) <= {r["mutant"] for r in runs}
    assert {"tiled_seed", "rank_seed"} <= {r["mutant"] for r in runs}
    for r in killed:  # by a numerical/structural check, not by a crash the bug caused
        assert r["evidence"]["killed_by"] in CHECKS, (r["cell_id"], r["mutant"], r["evidence"])


VACUOUS_CASE = '''
"""A broken case: it runs the CP LayerNorm but never compares it with the serial one."""
import torch
from torch.distributed.tensor import Shard

from cpmatrix.suite import pad_and_shard, planted
from cpmatrix.suite.cases.common import suite_mutants
from cpmatrix.suite.ops.layernorm import ShardedLayerNorm


@suite_mutants("no_grad_allreduce")
def forgets_to_compare(cell):
    with planted(cell.mutant):
        ln = ShardedLayerNorm(4, cell.mesh).to(cell.dtype)
        x = torch.randn(8, 4, generator=cell.generator, dtype=cell.dtype)
        ln(pad_and_shard(x, cell.mesh, (Shard(0), Shard(0)))).to_local().sum().backward()
'''


@pytest.mark.slow
def test_a_case_that_does_not_compare_lets_its_mutant_survive(tmp_path: Path) -> None:
    (tmp_path / "vacuous_cases.py").write_text(VACUOUS_CASE)
    (tmp_path / "vacuous.yaml").write_text(
        "version: 1\npythonpath: [\".\"]\n"
        "platforms:\n  cpu: {backend: gloo, device: cpu}\n"
        "targets:\n  - {name: vacuous, case: \"vacuous_cases:forgets_to_compare\", "
        "level: layer, timeout: short, axes: {mesh: [1x2], dtype: [fp64]}}\n")
    run = _run(tmp_path / "out", "--matrix", str(tmp_path / "vacuous.yaml"), "--mutants")
    assert run.returncode == 1, run.stdout
    assert "mutants: 0/1 killed (kill rate 0.0%)" in run.stdout
    assert "vacuous[layer,1x2,fp64,autocast=off,reference]@cpu!mutant=no_grad_allreduce" \
        in run.stdout
    survived = next(r for r in run.results if r["mutant"])
    assert survived["evidence"]["mutant_outcome"] == "survived"
