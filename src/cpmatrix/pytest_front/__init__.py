"""The pytest front: an existing distributed pytest suite, run in cpmatrix's worlds.

Two ways in, one core:

- ``pytest --cpmatrix`` (:mod:`~cpmatrix.pytest_front.plugin`, a ``pytest11`` entry point
  that does nothing until asked): the multi-rank tests of a normal pytest run become
  cells, run in persistent worlds, and are reported through pytest's own hooks; every
  other test runs as usual.
- a ``pytest:`` matrix target (a file, folder or node id): its collected tests become
  cells of the matrix, so cache, shards, Slurm, the report, the gate and ``cpmatrix
  repro`` work for existing suites too.

Its pure parts live with the spec, in ``cpmatrix/matrix/`` (``pytest_spec``: a pytest
target's cells; ``pytest_sources``: their digests; ``pytest_verdict`` and
``pytest_records``: the verdict over the ranks' reports; ``pytest_collect``: the
collector's driver), so the matrix and the run's executor (``run/executors/pytest_world``)
import nothing from here. :mod:`~cpmatrix.pytest_front.rank` and
:mod:`~cpmatrix.pytest_front.inrank` run inside the ranks; the plugin, its controller,
the collector, its flags (``options``) and the one adapter to the run sit on top
(``tests/unit/test_architecture.py``). This file imports nothing.
"""
