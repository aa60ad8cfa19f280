"""The defaults that more than one layer reads, each written once, here.

A default that both fronts (``cpmatrix run`` and ``pytest --cpmatrix``), the spec and the
ranks must agree on lives here, and each of them imports it: a copy written elsewhere
would drift the day one of them changes (tests/unit/test_defaults.py lists the readers
and fails on a copy). A default only one section of the settings reads stays with that
section (``FaultTimings.abort_grace_s`` in :mod:`cpmatrix.supervise.settings`).

Standard library only: the ranks import it (``worker/protocol/records.py``).

Example::

    >>> TIMEOUT_S, RUNNER, LAUNCHER
    (300, 'local', 'fork')
"""

from __future__ import annotations

from typing import Final

__all__ = ["LAUNCHER", "RUNNER", "TIMEOUT_S"]

#: Seconds a cell (a matrix target, a pytest test) may run when it names no timeout:
#: Bazel's ``moderate`` class, which is also MultiProcessTestCase's own default.
TIMEOUT_S: Final = 300
#: How a world's process tree is isolated (``--runner``, ``--cpmatrix-runner``): no
#: isolation beyond the process, which every host has.
RUNNER: Final = "local"
#: How a local world's ranks start (``--launcher``, ``--cpmatrix-launcher``): one parent
#: imports torch once, then forks the ranks (docs/worlds.md has the measured choice).
LAUNCHER: Final = "fork"
