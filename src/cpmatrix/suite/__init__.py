"""The reference context-parallel suite: real CP ops on a 2-D ("cp0", "cp1") mesh.

Each op has a serial twin (plain torch on full tensors) and takes its CP inputs cut by
:func:`~cpmatrix.suite.distribute.pad_and_shard`, the suite's sharding convention (part of
the code under test; the toolkit's own distributor is :func:`cpmatrix.parity.distribute`).
Levels:

* unit — :mod:`.ops.collectives` (all-gather / reduce-scatter along one axis, the
  pair transpose, replicated-parameter gradients) and :mod:`.ops.ring_attention`;
* layer — :mod:`.ops.layernorm` (sharded LayerNorm) and :mod:`.ops.attention_layer`;
* module — :mod:`.ops.triangle`, :mod:`.ops.pair_attention`, :mod:`.ops.pair_block`;
* workflow — :mod:`.model` (a small model and a training step);
* kernels — :mod:`.kernels` (Triton softmax / online-softmax merge / LayerNorm).

Planted bugs for negative controls are listed in :data:`.mutants.MUTANTS`.
Importing this package imports torch but not triton.
"""

from cpmatrix.suite.distribute import (
    from_local,
    pad_and_shard,
    pair_pad,
    pair_placements,
    pair_size,
    seq_placements,
    undistribute,
)
from cpmatrix.suite.mutants import MUTANTS, planted

__all__ = [
    "MUTANTS",
    "from_local",
    "pad_and_shard",
    "pair_pad",
    "pair_placements",
    "pair_size",
    "planted",
    "seq_placements",
    "undistribute",
]
