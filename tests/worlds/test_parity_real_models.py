"""Issue 22, "the parity toolkit on real models": each of the nine findings, through the real
CLI on real gloo worlds.

One ``cpmatrix run --mutants`` of ``tests/resources/parity/real_models.yaml`` (a
module-scoped fixture, one world) serves every test: the llama-style recipe
(``cpmatrix.recipes.llama``: a complex64 RoPE buffer used via ``view_as_complex``, a TP/SP
plan, loss parallel, FSDP2) and the small cases of ``real_models.py``. Each planted bug is a
mutant of a passing cell, so a test reads both the positive control and the kill; the one
cell that fails on purpose (``always_wrong``) shows a mutant NOT JUDGED.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from world_runs import Run, read_run

RES = Path(__file__).parents[1] / "resources" / "parity"
ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("real_models") / "out"
    proc = run_cli("run", "--matrix", str(RES / "real_models.yaml"), "--mutants",
                   "--out", str(out), "--plain", timeout=600)
    yield read_run(out, proc.returncode, proc.stdout + proc.stderr)


def _passed(r: dict[str, Any]) -> dict[str, Any]:
    assert r["status"] == "passed", (r["cell_id"], r["failures"])
    ev: dict[str, Any] = r["evidence"]
    return ev


def _killed(r: dict[str, Any], by: str) -> str:
    assert r["status"] == "killed", (r["cell_id"], r["mutant"], r["status"], r["message"])
    assert r["evidence"]["killed_by"] == by, r["evidence"]
    message: str = r["failures"][0]["message"]
    return message


def test_finding_1_a_complex_rope_buffer_stays_complex_and_a_conjugated_rope_is_killed(
    run: Run,
) -> None:
    # main cast freqs_cis to a real dtype: both sides ran without rotary embeddings, and
    # the conjugated RoPE (a no-op on a real table) survived on every cell
    for target in ("llama_rope_tp", "llama_rope"):
        for dtype, want in (("fp64", "torch.complex128"), ("fp32", "torch.complex64")):
            ev = _passed(run.cell(f"{target}[", having=dtype))
            assert f"buffer freqs_cis: torch.complex64 -> {want}" in ev["parity.check.setup"]
            assert ev["parity.check.buffer"].startswith("ok:")
            _killed(run.cell(f"{target}[", "rope_conjugated", dtype), "output")


def test_finding_2_running_statistics_of_local_rows_are_killed_by_the_buffer_check(
    run: Run,
) -> None:
    ev = _passed(run.cell("batchnorm["))
    assert ev["parity.check.buffer"].startswith("ok: 3 tensors within tolerance")
    mutant = run.cell("batchnorm[", "local_running_stats")
    message = _killed(mutant, "buffer")
    assert "bn.running_mean: max abs" in message
    assert mutant["evidence"]["parity.check.output"].startswith("ok")  # forward still right


def test_finding_3_tensors_inside_a_list_are_inputs_with_their_own_grads(run: Run) -> None:
    ev = _passed(run.cell("list_inputs["))
    assert ev["parity.check.input_grad"].startswith("ok: 3 tensors within tolerance")
    message = _killed(run.cell("list_inputs[", "listed_grad_x3"), "input_grad")
    assert "xs.1: max abs" in message and "xs.0:" not in message
    assert "CP = 3 x serial everywhere" in message


def test_finding_4_an_8192_long_bf16_softmax_without_its_all_reduce_fails(run: Run) -> None:
    ev = _passed(run.cell("long_softmax["))
    assert ev["parity.judged_by"] == "twin: 2 tensors"
    message = _killed(run.cell("long_softmax[", "no_allreduce"), "output")
    assert "|cp - twin|" in message and "fp64 twin" in message


def test_finding_5_fsdp2_tp_llama_on_2x2_fp32_passes_with_no_loosening(run: Run) -> None:
    ev = _passed(run.cell("llama_fsdp_tp["))
    assert "parity.tolerance_reason" not in ev  # nothing loosened
    assert ev["parity.tolerance"].startswith("fp64 twin: |cp - twin| <= 4 x")
    assert ev["parity.twin"].startswith("ran")
    assert ev["parity.judged_by"].startswith("twin:")
    assert ev["parity.check.param_grad"].startswith("ok")
    # the fixed fp32 row (atol 1e-5) would have failed this correct code
    assert float(ev["parity.max_abs"]) > 1e-5


def test_finding_6_loss_parallel_covers_the_cp_sides_backward(run: Run) -> None:
    # context=loss_parallel: forward, loss and backward inside it (main had no way: its
    # loss= wrapped the loss forward only, and backward mixed Tensor and DTensor)
    for dtype in ("fp64", "fp32"):
        ev = _passed(run.cell("llama_rope[", having=dtype))
        assert ev["parity.check.loss"].startswith("ok: 2 tensors within tolerance")
        assert "param output.weight over cp1" in ev["parity.sharded"]


def test_finding_7_mutants_are_judged_only_against_a_passing_cell(run: Run) -> None:
    assert run.returncode == 1  # always_wrong fails on purpose
    wrong = run.cell("always_wrong[")
    assert wrong["status"] == "failed"
    unjudged = run.cell("always_wrong[", "also_wrong")
    assert unjudged["status"] == "not_judged"
    assert "its unmutated cell FAILED in this run" in unjudged["message"]
    mutant_statuses = {r["status"] for r in run.results if r["mutant"]}
    assert mutant_statuses == {"killed", "not_judged"}  # never passed/failed
    assert "NOT JUDGED always_wrong[" in run.stdout
    assert "KILLED  llama_rope[" in run.stdout
    assert "PASSED  " not in "\n".join(ln for ln in run.stdout.splitlines() if "!mutant=" in ln)
    assert "mutants: 11/11 killed (kill rate 100.0%); 1 not judged" in run.stdout
    report = (run.out / "report.xml").read_text()
    assert '<property name="status" value="killed" />' in report
    assert '<property name="status" value="not_judged" />' in report


def test_finding_8_messages_say_what_is_wrong(run: Run) -> None:
    # a wrong output shape: one line, the grad checks skipped (not 21 "missing" grads)
    shape = run.cell("tp_output_shape[", "down_colwise")
    message = _killed(shape, "replicated_identical")  # each rank returns its own columns
    assert shape["evidence"]["parity.failed"] == "replicated_identical,output"
    assert message.endswith("\n  out: shape (5, 4) != serial (5, 8)")  # one line
    assert "missing on the CP side" not in message and "max abs inf" not in message
    assert shape["evidence"]["parity.check.param_grad"].startswith(
        "skipped: no CP backward ran: the CP output's shape is wrong")
    # a uniform ratio: mean vs sum over an axis of that size (on 2x2 either one)
    message = _killed(run.cell("llama_fsdp_tp[", "fsdp_mean_grads"), "param_grad")
    assert "CP = 0.5 x serial everywhere: mean vs sum over `cp0` or `cp1`?" in message
    # tied weights named as tied
    message = _killed(run.cell("tied_embeddings[", "not_retied"), "setup")
    assert message.startswith("ParityError: tied weights untied: emb.weight and out.weight")
    # the default placement of an input, stated in the error that needs it
    placed = run.cell("tied_embeddings[", "tokens_default_placement")
    assert placed["status"] == "killed"
    assert "got input ['tokens'] as a replicated DTensor" in placed["failures"][0]["traceback"]
    assert "placements={'tokens': None}" in placed["failures"][0]["traceback"]
    # no differentiable input: said plainly
    ev = _passed(run.cell("llama_rope[", having="fp64"))
    assert ev["parity.check.nonzero"].startswith("ok")
    tied = _passed(run.cell("tied_embeddings["))
    assert tied["parity.check.input_grad"] == (
        "skipped: no input takes a gradient (only integer inputs, requires_grad=False, or none)")


def test_finding_9_torchs_context_parallel_is_a_cuda_recipe_planned_on_cpu() -> None:
    # torch 2.13's context_parallel cannot run on CPU: the recipe is on the cuda platform,
    # planned here with --dry-run, and the limitation is stated where users read about CP
    proc = run_cli("run", "--matrix", str(ROOT / "matrix" / "recipes.yaml"), "--platform",
                   "cuda", "-k", "torch_context_parallel", "--dry-run", "--gpus", "4")
    assert proc.returncode == 0, proc.stderr
    assert "torch_context_parallel[layer,1x2,fp32,autocast=off,reference]@cuda" in proc.stdout
    assert "torch_context_parallel[layer,1x4,fp32,autocast=off,reference]@cuda" in proc.stdout
    cpu = run_cli("list", "--matrix", str(ROOT / "matrix" / "recipes.yaml"), "--platform",
                  "cpu", "-k", "torch_context_parallel")
    assert cpu.returncode == 3, cpu.stdout  # nothing on the CPU platform
    for doc in ("README.md", "docs/recipes.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert "does not run on CPU" in text, doc
        assert "_scaled_dot_product_flash_attention_for_cpu" in text, doc
