"""Workflow case: training steps of the suite's small model, CP vs serial.

:class:`~cpmatrix.suite.model.CPSmallModel` (LayerNorm + ring attention on the sequence
track, outer sum into the pair track, pair block, masked MSE loss all-reduced over the mesh)
against :class:`~cpmatrix.suite.model.SmallModel`, through ``check_parity(optimizer=...)``:
the loss at every step, every parameter grad after the first backward and the weight
deltas after the last step. The batch is one DataModule sample cut by the model's own
production distributor (``distribute_batch``, via
:func:`~cpmatrix.suite.cases.common.model_view`).

SGD with momentum on purpose: it is not scale-invariant, so a gradient multiplied by the
number of ranks (mutant ``loss_double_count``) changes the weight deltas; Adam would divide
it out.

Example (a matrix target)::

    - name: train_step
      case: "cpmatrix.suite.cases.workflow:train_step"
      level: workflow
      axes: {mesh: [1x2, 2x2], dtype: [fp64]}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from cpmatrix.parity import FEATURES, check_parity
from cpmatrix.suite.cases.common import data_module, model_view, suite_mutants, with_planted
from cpmatrix.suite.model import Batch, CPSmallModel, ModelConfig, SmallModel

__all__ = ["Trained", "config", "train_step", "train_step_single"]

#: Optimizer steps compared (the loss at each, the weight deltas after the last).
STEPS = 2


def config() -> ModelConfig:
    """The small model sized to the DataModule's features (token and pair feature widths)."""
    widths = {s.name: s.axes[-1] for s in FEATURES}
    return ModelConfig(d_in=int(widths["token_feats"]), c_in=int(widths["pair_feats"]))


class Trained(nn.Module):
    """``check_parity`` passes the feature dict; the model takes a :class:`Batch`."""

    def __init__(self, model: SmallModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, feats: dict[str, Any]) -> torch.Tensor:
        loss: torch.Tensor = self.model(Batch(**feats))
        return loss


def _sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out  # the model returns its loss


def _train_step(cell: Any) -> None:
    cfg = config()
    with with_planted(cell):
        batch = data_module(cell, model_view, n_tokens=int(cell.params.get("n", 7)),
                            need_masked_token=True)
        check_parity(cell, Trained(SmallModel(cfg)),
                     Trained(CPSmallModel(cfg, cell.mesh, path=cell.path)),
                     inputs={"feats": batch}, optimizer=_sgd, steps=STEPS, loss=_loss,
                     label="train")


@suite_mutants("loss_double_count", "no_grad_allreduce")
def train_step(cell: Any) -> None:
    """Two SGD steps of the small model on a mesh with more than one rank."""
    if cell.mesh.size() < 2:
        raise ValueError("train_step needs > 1 rank; use train_step_single on 1x1")
    _train_step(cell)


@suite_mutants("tri_mask_off")
def train_step_single(cell: Any) -> None:
    """Two SGD steps on one rank (1x1): the model's math and masks."""
    _train_step(cell)
