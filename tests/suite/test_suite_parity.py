"""CP vs serial parity of every reference-suite op on real gloo worlds, and its negative controls.

One world per mesh runs every check (see ``_suite_checks``); the tests below read its
results. Meshes: 1x1 (the decomposition with no-op collectives), 1x2 (even sizes; also
the Triton kernel path, fp32, and bf16 autocast), 2x2 (padding: N=5), 2x3 (non-square
with both axes > 1; N=9, so one column shard and one sequence shard hold a single real
element and others none). Every planted mutant must make its check fail on 2x2.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # helpers, also under --import-mode=importlib

from _suite_checks import CHECKS
from _suite_world import Job, run_world

from cpmatrix.suite.mutants import MUTANTS

#: mesh -> (shape, n): n is the base size of the checks (pair N; sequences use n+1, n+2)
MESHES: dict[str, tuple[tuple[int, int], int]] = {
    "1x1": ((1, 1), 5),
    "1x2": ((1, 2), 6),
    "2x2": ((2, 2), 5),
    "2x3": ((2, 3), 9),
}
#: the mesh whose world also runs the kernel path (fp32), bf16 autocast and plain bf16
KERNEL_MESH = "1x2"
#: the mesh whose world also runs every mutant
MUTANT_MESH = "2x2"

#: mutant -> the check that must catch it
MUTANT_CHECKS: dict[str, str] = {
    "shard_offset_off_by_one": "layer_norm",
    "no_grad_allreduce": "layer_norm",
    "allgather_bwd_no_reduce": "all_gather",
    "reduce_scatter_no_sum": "reduce_scatter",
    "transpose_view_not_permute": "transpose",
    "ring_skip_last_step": "ring_attention",
    "lse_merge_sign": "ring_attention",
    "ring_no_dkv_return": "ring_attention",
    "pad_mask_off": "ring_attention",
    "tri_mask_off": "triangle_outgoing",
    "loss_double_count": "train_step",
}

#: extra (label, check, params, dtype) on the kernel mesh
KERNEL_JOBS: list[tuple[str, str, dict[str, Any], str]] = [
    (f"kernel:{c}", c, {"path": "kernel"}, "float32")
    for c in ("layer_norm", "attention_layer", "pair_attention")
] + [
    (f"autocast:{c}", c, {"autocast": True}, "float32")
    for c in ("attention_layer", "pair_block")
] + [
    (f"bf16:{c}", c, {}, "bfloat16") for c in ("attention_layer", "pair_block")
]


def _jobs(mesh: str) -> list[Job]:
    _, n = MESHES[mesh]
    jobs = [Job(name, f"_suite_checks:check_{name}", params=(("n", n),)) for name in CHECKS]
    if mesh == KERNEL_MESH:
        jobs += [Job(label, f"_suite_checks:check_{c}", dtype=dt,
                     params=(("n", n), *sorted(p.items())))
                 for label, c, p, dt in KERNEL_JOBS]
    if mesh == MUTANT_MESH:
        jobs += [Job(f"mutant:{m}", f"_suite_checks:check_{c}", mutant=m, params=(("n", n),))
                 for m, c in MUTANT_CHECKS.items()]
    return jobs


@cache
def _world(mesh: str, out_dir: str) -> dict[str, Any]:
    """Run the mesh's world once per session; a crash is kept and re-raised per test."""
    shape, _ = MESHES[mesh]
    env = {"TRITON_INTERPRET": "1"} if mesh == KERNEL_MESH else {}
    try:
        return run_world(shape, _jobs(mesh), Path(out_dir) / f"world-{mesh}.json", env)
    except Exception as e:  # the world died: every test of this mesh reports it
        return {"__crash__": f"{type(e).__name__}: {e}"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = str(tmp_path_factory.mktemp("suite-worlds"))

    def get(mesh: str) -> dict[str, Any]:
        res = _world(mesh, out)
        if "__crash__" in res:
            pytest.fail(f"the {mesh} world crashed: {res['__crash__']}")
        return res

    return get


def _result(world: Any, mesh: str, label: str) -> dict[str, Any]:
    res = world(mesh)
    assert label in res, f"{label} did not run on {mesh}"
    r: dict[str, Any] = res[label]
    return r


PARITY = [(mesh, name) for mesh in MESHES for name in CHECKS]
EXTRA = [(KERNEL_MESH, label) for label, *_ in KERNEL_JOBS]


@pytest.mark.slow
@pytest.mark.parametrize(("mesh", "label"), PARITY + EXTRA,
                         ids=[f"{m}-{c}" for m, c in PARITY + EXTRA])
def test_parity(world: Any, mesh: str, label: str) -> None:
    r = _result(world, mesh, label)
    # self-verifying log: the evidence is printed on success too (pytest -rP shows it)
    print(f"[{mesh}] {label} ({r['seconds']} s)", *r["lines"], sep="\n  ")
    assert r["ok"], "\n".join(r["failures"])


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(MUTANT_CHECKS))
def test_mutant_is_killed(world: Any, mutant: str) -> None:
    r = _result(world, MUTANT_MESH, f"mutant:{mutant}")
    print(f"[{MUTANT_MESH}] {mutant} -> check {MUTANT_CHECKS[mutant]}", *r["failures"][:8],
          sep="\n  ")
    assert not r["ok"], f"mutant {mutant} survived check {MUTANT_CHECKS[mutant]}"
    # killed by a numerical mismatch, not by a crash the bug happened to cause
    assert any("raised:" not in f for f in r["failures"]), r["failures"]


def test_every_mutant_has_a_negative_control() -> None:
    assert set(MUTANT_CHECKS) == set(MUTANTS)
    assert set(MUTANT_CHECKS.values()) <= set(CHECKS)
