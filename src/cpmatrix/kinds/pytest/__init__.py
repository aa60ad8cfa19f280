"""The pytest front: an existing distributed pytest suite, run in cpmatrix's worlds.

Two ways in, one core:

- ``pytest --cpmatrix`` (:mod:`~cpmatrix.kinds.pytest.plugin`, a ``pytest11`` entry point
  that does nothing until asked): the multi-rank tests of a normal pytest run become
  cells, run in persistent worlds, and are reported through pytest's own hooks; every
  other test runs as usual.
- a ``pytest:`` matrix target (a file, folder or node id): its collected tests become
  cells of the matrix, so cache, shards, Slurm, the report, the gate and ``cpmatrix
  repro`` work for existing suites too.

The kind's parts live together here, each on the layer it serves
(``tests/unit/test_architecture.py``): with the spec, its pure parts (``spec``: a pytest
target's cells; ``sources``: their digests; ``verdict`` and ``records``: the verdict over
the ranks' reports); in the ranks, :mod:`~cpmatrix.kinds.pytest.rank_session` and
:mod:`~cpmatrix.kinds.pytest.rank_dialects`; with the supervisor, its executor
(``executor``); and on top, the plugin, its controller, the collector (``collect``, which
the CLI and the gate hand to the matrix's expansion; ``collect_main``, its process), its
flags (``options``) and the one adapter to the run. This file imports nothing.
"""
