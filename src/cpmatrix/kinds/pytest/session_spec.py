"""The pytest session a test was collected in, as its ranks re-create it; the kind's name.

This is what the rank side of the pytest kind reads of the spec side
(:mod:`cpmatrix.kinds.pytest.rank_session`): it imports nothing of ``cpmatrix.matrix``, so
a world's processes run none of the matrix's modules (``tests/unit/test_architecture.py``
reads their import closure).

Example::

    >>> s = PytestSession(dir="/r", args=("tests",), rootdir="/r")
    >>> PytestSession.from_json(s.to_json()) == s
    True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Final

from cpmatrix.digest import canonical_json

__all__ = ["KIND", "PytestSession"]

#: The cell kind of pytest tests (``matrix.schema.KINDS``; ``Cell.kind``, ``CellSpec.kind``).
KIND: Final = "pytest"


@dataclass(frozen=True, slots=True, kw_only=True)
class PytestSession:
    """How a rank re-creates the pytest session its tests were collected in.

    ``args`` is the pytest command line as given (the rank overrides what cannot apply
    there: reporting, selection, ``--cpmatrix`` itself), ``dir`` the folder it was given
    in (the rank's working folder during a test), ``sys_path`` the collecting process's
    ``sys.path`` (so a rank imports what pytest imported, from the same places),
    ``rootdir`` and ``inifile`` (empty: none) what pytest found there: the rank pins
    them, never finding its own (pytest reads a plugin option's value, such as
    ``--cpmatrix-out DIR``, as a path while it looks for the rootdir: a folder made
    since would move it).
    """

    dir: str
    args: tuple[str, ...]
    rootdir: str
    sys_path: tuple[str, ...] = ()
    inifile: str = ""

    def to_json(self) -> str:
        return canonical_json(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PytestSession:
        data = json.loads(text)
        return cls(dir=str(data["dir"]), args=tuple(map(str, data["args"])),
                   rootdir=str(data["rootdir"]),
                   sys_path=tuple(map(str, data.get("sys_path", ()))),
                   inifile=str(data.get("inifile", "")))
