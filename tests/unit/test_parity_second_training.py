"""Issue 31: a training check's step 0 backward for its probes and second sample.

The probes and the second serial sample backward the outputs with fixed grad_outputs; in
a training check those are the loss's grad w.r.t. each output, which
:func:`cpmatrix.parity._training._twin_step` returns beside the twin's own step. Real
modules on CPU, no world: the world part (probes ran, the sample taken on 2x2, the bugs
killed) is tests/worlds/test_parity_training_second_worlds.py. Also the probes' second
pair, which moves the module outputs alone (the probe gap of the flip cases: the world
part is in tests/worlds/test_parity_flip_worlds.py).
"""

from __future__ import annotations

import torch
from torch import nn

from cpmatrix.parity._training import _twin_step
from cpmatrix.parity._twin import make_twin, upcast_inputs


def _twin_and_inputs() -> tuple[object, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    module = nn.Linear(4, 3)
    twin = make_twin(module)
    t_ins, _ = upcast_inputs({"input": torch.randn(5, 4)}, [])
    return twin, t_ins


def test_the_default_loss_backwards_the_projections_themselves() -> None:
    twin, t_ins = _twin_and_inputs()
    proj = {"out": torch.randn(5, 3)}
    opt = torch.optim.SGD(twin.module.parameters(), lr=0.1)  # type: ignore[attr-defined]
    _, _, grads = _twin_step(twin, t_ins, proj, None, opt)  # type: ignore[arg-type]
    assert set(grads) == {"out"} and grads["out"] is proj["out"]
    # the twin's step ran as before: its parameter grads are the projection's
    w = twin.module.weight.grad  # type: ignore[attr-defined]
    assert torch.allclose(w, proj["out"].double().T @ t_ins["input"])


def test_a_custom_loss_gives_its_grad_wrt_each_output_and_still_steps() -> None:
    twin, t_ins = _twin_and_inputs()
    opt = torch.optim.SGD(twin.module.parameters(), lr=0.1)  # type: ignore[attr-defined]
    out, _, grads = _twin_step(twin, t_ins, {}, lambda o: (o**2).mean(), opt)  # type: ignore[arg-type]
    want = 2 * out["out"].detach() / out["out"].numel()
    assert set(grads) == {"out"} and torch.allclose(grads["out"], want)
    assert grads["out"].dtype == torch.float64
    # backward with those grads gives the twin's own parameter grads (the graph was kept)
    w = twin.module.weight.grad  # type: ignore[attr-defined]
    assert w is not None and torch.allclose(w, want.T @ t_ins["input"])


class _Seen(nn.Linear):
    """Records every input it is called with (the probes' runs included)."""

    def __init__(self) -> None:
        super().__init__(4, 3)
        self.seen: list[torch.Tensor] = []

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self.seen.append(input.detach().clone())
        return super().forward(input)


def test_the_second_probe_pair_moves_the_module_outputs_alone() -> None:
    # An input step and an output step in one probe can cancel at a pre-activation near
    # 0 (the relu_mlp survivor, tests/resources/parity/probe_gap.yaml): the second pair
    # leaves the inputs as the twin's run had them, so its output step alone meets it.
    from cpmatrix.parity._twin import backward_twin, run_probes

    torch.manual_seed(0)
    twin = make_twin(_Seen())
    t_ins, _ = upcast_inputs({"input": torch.randn(5, 4)}, [])
    grads = {"out": torch.randn(5, 3)}
    out = twin.module(**t_ins)
    backward_twin({"out": out}, grads)
    twin.outputs, twin.input_grads = {"out": out.detach()}, {}
    twin.param_grads = {n: p.grad for n, p in twin.module.named_parameters()}
    twin.module.seen.clear()
    run_probes(twin, t_ins, [], grads, 2**-7)
    seen = twin.module.seen
    assert twin.probed and len(seen) == 4
    moved = [not torch.equal(x, t_ins["input"]) for x in seen]
    assert moved == [True, True, False, False], moved
    # and the outputs of every probe are moved (the hooks ran in both pairs)
    probes = twin.outputs["out"].probes
    assert all(not torch.equal(p, twin.outputs["out"].value) for p in probes)
