"""Issue 31: a training check (``optimizer=``) judges its step 0 as a step check does.

One ``cpmatrix run --mutants`` of ``tests/resources/parity/training.yaml``: the flip cases'
ReLU MLP trained two SGD steps (default loss: a random projection of the outputs), fp32
and bf16 (autocast on and off), 1x2 and 2x2, with a 10% bug on its 1- or 3-element last
bias grad and the hidden bias grad halved. Step 0's twin is probed, and on 2x2 (rows
sharded over cp0) its tiny tensors take the second serial sample. Before that, three of
these bugs survived (bf16 under autocast: the pooled rule let 39% and 76% of the bias
pass; docs/parity.md, "The second serial sample").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_runner import run_cli
from world_runs import Run, read_run

RES = Path(__file__).parents[1] / "resources" / "parity"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("training") / "out"
    proc = run_cli(
        "run",
        "--matrix",
        str(RES / "training.yaml"),
        "--mutants",
        "--out",
        str(out),
        "--plain",
        timeout=600,
    )
    yield read_run(out, proc.returncode, proc.stdout + proc.stderr)


def test_correct_training_cells_pass_and_every_tiny_bias_bug_is_killed_at_step_0(run: Run) -> None:
    plain = [r for r in run.results if not r.get("mutant")]
    mutated = [r for r in run.results if r.get("mutant")]
    assert len(plain) >= 12 and len(mutated) >= 24, [r["cell_id"] for r in run.results]
    for r in mutated:
        assert r["status"] == "killed", (r["cell_id"], r["status"], r["message"])
        assert r["evidence"]["killed_by"] == "param_grad", r["evidence"]
    for r in plain:
        assert r["status"] == "passed", (r["cell_id"], r["failures"])
        assert "probes" in r["evidence"]["parity.twin"], r["evidence"]["parity.twin"]


def test_step_0_takes_the_second_sample_where_the_cp_side_shards_the_rows(run: Run) -> None:
    # 2x2: rows over cp0 (2 pieces): step 0's tiny bias judged with a second sample; its
    # grad resolves a 10% bug (the resolution line's `param_grad fc2.bias`)
    for cell in (
        "2x2,bf16,autocast=on,reference,d_out=1]",
        "2x2,bf16,autocast=off,reference,d_out=3]",
    ):
        ev = run.cell("relu_mlp_train[", having=cell)["evidence"]
        assert ev["parity.second_sample"].startswith("step 0: a second serial sample"), ev
        assert "rows split into 2 interleaved chunks" in ev["parity.second_sample"], ev
        first = ev["parity.resolution"].split("; ")[0]
        assert first.startswith("param_grad fc2.bias: "), first  # step 0's grad, named so
        assert "BELOW RESOLUTION" not in first, first
        # the killed bug's failure line says the sample judged the bias (not the pooled
        # rule alone): "(serial's own 0.00146, ..., a second serial sample's 0.00684)"
        killed = run.cell("relu_mlp_train[", "bias_grad_10pct", having=cell)
        grad_line = next(
            line
            for line in killed["failures"][0]["message"].splitlines()
            if line.strip().startswith("fc2.bias: ")
        )
        assert "a second serial sample's " in grad_line, grad_line
    # 1x2: the CP side sums the rows in one piece, as serial does: no second sample
    ev = run.cell("relu_mlp_train[", having="1x2,bf16,autocast=on,reference,d_out=3]")
    assert "parity.second_sample" not in ev["evidence"], ev["evidence"]
