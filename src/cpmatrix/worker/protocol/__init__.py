"""The world protocol: everything a supervisor and its children exchange, named once.

Both sides import it, and neither spells a file name, store key or status word by hand
(``tests/unit/test_protocol.py`` fails if one does). Standard library only: the worker
side (:mod:`~cpmatrix.worker.world_main`, :mod:`~cpmatrix.worker.forkrun`,
:mod:`~cpmatrix.worker.compile_main`) imports it at start-up.

- :mod:`~cpmatrix.worker.protocol.records`: the typed files (job files, start markers,
  outcomes, pid and left files, the fork launcher's root cause), written atomically and
  read back as their type or not at all;
- :mod:`~cpmatrix.worker.protocol.folders`: where each file lives (a world's folder, a
  compile job's, a cell's files);
- :mod:`~cpmatrix.worker.protocol.store`: the keys and words a cell's ranks exchange
  through the launcher's store (the agreement before a cell, the reports after it).

Example::

    >>> from pathlib import Path
    >>> folder = WorldFolder(Path("w"))
    >>> str(folder.marker(0, 1, START)), ready_key(0, 1)
    ('w/progress/0.r1.start', 'cpmatrix/0/ready/r1')
"""

from __future__ import annotations

from cpmatrix.worker.protocol.folders import (
    DONE,
    START,
    CompileFolder,
    MarkerKind,
    WorldFolder,
    marker_name,
    parse_marker_name,
)
from cpmatrix.worker.protocol.records import (
    ERROR,
    OK,
    CellSpec,
    CompileJob,
    Outcome,
    OutcomeStatus,
    PidFile,
    PytestSpec,
    RankLeft,
    RootCause,
    StartMarker,
    WorldSpec,
    read_typed,
    write_typed,
)
from cpmatrix.worker.protocol.store import (
    RECYCLE,
    PeerReport,
    PeerStatus,
    Ready,
    cut_key,
    done_key,
    group_prefix,
    ready_key,
    report_key,
)

__all__ = [
    "DONE",
    "ERROR",
    "OK",
    "RECYCLE",
    "START",
    "CellSpec",
    "CompileFolder",
    "CompileJob",
    "MarkerKind",
    "Outcome",
    "OutcomeStatus",
    "PeerReport",
    "PeerStatus",
    "PidFile",
    "PytestSpec",
    "RankLeft",
    "Ready",
    "RootCause",
    "StartMarker",
    "WorldFolder",
    "WorldSpec",
    "cut_key",
    "done_key",
    "group_prefix",
    "marker_name",
    "parse_marker_name",
    "read_typed",
    "ready_key",
    "report_key",
    "write_typed",
]
