"""The pytest front: an existing distributed pytest suite, run in cpmatrix's worlds.

Two ways in, one core:

- ``pytest --cpmatrix`` (:mod:`~cpmatrix.pytest_front.plugin`, a ``pytest11`` entry point
  that does nothing until asked): the multi-rank tests of a normal pytest run become
  cells, run in persistent worlds, and are reported through pytest's own hooks; every
  other test runs as usual.
- a ``pytest:`` matrix target (a file, folder or node id): its collected tests become
  cells of the matrix, so cache, shards, Slurm, the report, the gate and ``cpmatrix
  repro`` work for existing suites too.

The modules sit on different layers (``tests/unit/test_architecture.py``):
:mod:`~cpmatrix.pytest_front.spec`, :mod:`~cpmatrix.pytest_front.sources` and
:mod:`~cpmatrix.pytest_front.verdict` are pure (the matrix layer);
:mod:`~cpmatrix.pytest_front.rank` and :mod:`~cpmatrix.pytest_front.inrank` run inside the
ranks (the remote layer); :mod:`~cpmatrix.pytest_front.job` is the world job of ``pytest``
cells (the run layer); the plugin, its controller, the collector and the one adapter to
the run sit on top. This file imports nothing, so the pure parts stay cheap to import.
"""
