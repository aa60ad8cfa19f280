"""The parity toolkit: what a CP developer writes inside a case.

Parity tests (serial reference vs CP implementation, forward and backward) and property
tests (RNG entropy, dtype paths) that cannot pass vacuously, with evidence and mutants.

- :func:`check_parity` - the one call: weights, inputs, random grad_output, every
  comparison and anti-vacuous check, evidence; unit, layer, module and workflow level.
- :mod:`.tolerance` - the fp64 twin rule and the fixed table; loosening needs a reason.
- :mod:`.checks` - sharding active, replicated identical, grads non-zero, zero-init.
- :mod:`.compare` - every mismatching tensor with its max abs/rel difference.
- :mod:`.data` - the one synthetic Dataset/DataLoader/DataModule (contract in
  :mod:`.features`) and the toolkit's distributor (layout and sharding in :mod:`.layout`).
- :mod:`.rng` - RNG fingerprints per rank and the entropy property.
- :mod:`.dtypes` - pre-hook dtype probes (recompute pass included) and autocast asserts.
- :mod:`.mutants` - named planted bugs; :class:`ParityError` ``.check`` says who killed one.

Example (a complete case)::

    import torch
    from torch.distributed.tensor import Shard, distribute_module
    from cpmatrix.parity import TensorSpec, check_parity

    def linear_case(cell):
        torch.manual_seed(cell.seed)
        serial = torch.nn.Linear(16, 8)
        cp = torch.nn.Linear(16, 8)          # DTensor ops handle the sharded rows
        check_parity(cell, serial, cp,
                     inputs={"input": TensorSpec(shape=(12, 16))},
                     placements={"input": [Shard(0), Shard(0)]},
                     prepare_cp=lambda m, mesh: distribute_module(m, mesh))
"""

from cpmatrix.parity._inputs import TensorSpec
from cpmatrix.parity.checks import (
    CheckOutcome,
    assert_grads_nonzero_finite,
    assert_replicated_identical,
    assert_sharding_active,
    perturb_degenerate_,
)
from cpmatrix.parity.compare import Diff, compare_named, format_diffs
from cpmatrix.parity.data import (
    FEATURES,
    FeatureBatch,
    FeatureSpec,
    Layout,
    SyntheticDataModule,
    SyntheticFeatureDataset,
    compute_layout,
    distribute,
    distribute_features,
    make_dataloader,
    validate_features,
)
from cpmatrix.parity.dtypes import (
    DtypeProbe,
    assert_autocast_off,
    assert_autocast_on,
    assert_compute_dtype,
    expected_compute_dtype,
    storage_dtype,
)
from cpmatrix.parity.errors import (
    CHECKS,
    Check,
    DtypePathError,
    EntropyError,
    MismatchError,
    ParityError,
    ReplicationError,
    ToleranceError,
    VacuousError,
    check_of,
)
from cpmatrix.parity.mutants import declared_mutants, mutant_on, mutants
from cpmatrix.parity.rng import EntropyReport, RngRecorder, assert_entropy, load_fingerprints
from cpmatrix.parity.run import ParityReport, check_parity
from cpmatrix.parity.tolerance import (
    TOLERANCE_TABLE,
    Tolerance,
    TwinRule,
    resolve_tolerance,
    table_markdown,
    tolerance_for,
)
from cpmatrix.parity.trees import to_full

__all__ = [
    "CHECKS",
    "FEATURES",
    "TOLERANCE_TABLE",
    "Check",
    "CheckOutcome",
    "Diff",
    "DtypePathError",
    "DtypeProbe",
    "EntropyError",
    "EntropyReport",
    "FeatureBatch",
    "FeatureSpec",
    "Layout",
    "MismatchError",
    "ParityError",
    "ParityReport",
    "ReplicationError",
    "RngRecorder",
    "SyntheticDataModule",
    "SyntheticFeatureDataset",
    "TensorSpec",
    "Tolerance",
    "ToleranceError",
    "TwinRule",
    "VacuousError",
    "assert_autocast_off",
    "assert_autocast_on",
    "assert_compute_dtype",
    "assert_entropy",
    "assert_grads_nonzero_finite",
    "assert_replicated_identical",
    "assert_sharding_active",
    "check_of",
    "check_parity",
    "compare_named",
    "compute_layout",
    "declared_mutants",
    "distribute",
    "distribute_features",
    "expected_compute_dtype",
    "format_diffs",
    "load_fingerprints",
    "make_dataloader",
    "mutant_on",
    "mutants",
    "perturb_degenerate_",
    "resolve_tolerance",
    "storage_dtype",
    "table_markdown",
    "to_full",
    "tolerance_for",
    "validate_features",
]
