"""The evidence a check_parity label records about its tensors (``<label>.resolution``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from cpmatrix.parity._report import Verdicts, emit
from cpmatrix.parity.compare import Probed, compare_named
from cpmatrix.parity.tolerance import tolerance_for

D = torch.float64
BF16 = tolerance_for("bf16")



def test_the_resolution_evidence_names_each_tiny_tensors_check() -> None:
    # a training check compares `fc2.bias` as a grad and as a weight delta: which one a
    # 10% bug cannot fail on must be readable from the evidence
    twin = torch.tensor([0.0518], dtype=D)
    verdicts = Verdicts("train")
    verdicts.add_diffs("param_grad", compare_named({"fc2.bias": (
        twin.bfloat16(), twin.bfloat16(), Probed(twin, (), twin + 0.0049))}, BF16), BF16)
    verdicts.add_diffs("weight_delta", compare_named({"fc2.bias": (
        twin.bfloat16(), twin.bfloat16(), twin)}, BF16), BF16)
    recorded: dict[str, object] = {}
    emit(SimpleNamespace(record=recorded.__setitem__, rank=1), "train", verdicts, BF16, {})
    grad, delta = str(recorded["train.resolution"]).split("; ")
    assert grad.startswith("param_grad fc2.bias: a change under 41% of") and "BELOW" in grad
    assert delta.startswith("weight_delta fc2.bias: a change under 3.") and "BELOW" not in delta
