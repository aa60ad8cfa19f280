"""Recipes: real parallel patterns checked against their serial twins, to copy.

Each module is one pattern, a self-contained case written with the public toolkit only
(:mod:`cpmatrix.parity`), with the planted bugs users make (``@mutants``);
``matrix/recipes.yaml`` runs them, ``docs/recipes.md`` says what each shows.

- :mod:`.tensor_parallel` - an MLP with ``ColwiseParallel``/``RowwiseParallel`` on ``cp1``;
- :mod:`.sequence_parallel` - ``SequenceParallel`` on the norm around a TP MLP;
- :mod:`.fsdp_tp` - FSDP2 (``fully_shard``) over ``cp0`` with TP over ``cp1``;
- :mod:`.ulysses` - attention with all-to-all between sequence and head shards;
- :mod:`.ddp` - replicated parameters with a gradient all-reduce over the mesh.

Each module stands alone, so that it can be copied alone: the serial MLP twin is written
out in each recipe that uses it (a test keeps the copies identical).

Importing this package imports nothing; each recipe imports torch.
"""
