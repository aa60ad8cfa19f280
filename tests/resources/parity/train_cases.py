"""Training checks (``optimizer=``) on the flip cases' ReLU MLP: step 0 is probed and its
tiny tensors take the second serial sample, as a step check's do (issue 31).

:func:`relu_mlp_train`: :class:`flip_cases.MLP` against :class:`flip_cases.CPMLP` (rows
over ``cp0``, fc1 row-parallel over ``cp1``), two SGD steps with momentum and the default
loss (a random projection of the outputs: rows stay independent, so the serial side's
rows can be split into chunks). ``bias_grad_10pct`` scales the last bias's grad by 0.9.
"""

from __future__ import annotations

from typing import Any

import torch
from flip_cases import _BUG, _BUG_TEXT, _HIDDEN, _HIDDEN_TEXT, CPMLP, MLP
from torch.distributed.tensor import Shard

from cpmatrix.parity import TensorSpec, check_parity, mutants


@mutants(**{_BUG: _BUG_TEXT, _HIDDEN: _HIDDEN_TEXT})
def relu_mlp_train(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    d_out = int(cell.params.get("d_out", 3))
    check_parity(
        cell,
        MLP(16, 32, d_out),
        CPMLP(16, 32, d_out, cell),
        inputs={"x": TensorSpec(shape=(16, 16))},
        placements={"x": [Shard(0), Shard(1)]},
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        steps=2,
    )
