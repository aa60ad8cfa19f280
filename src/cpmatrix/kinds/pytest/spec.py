"""What the pytest front knows about a multi-rank test before it runs, and its cells. Pure.

A test that needs several ranks (see :mod:`cpmatrix.kinds.pytest.dialects`) is recorded as
a :class:`PytestTest`, in the user's pytest process (``--cpmatrix``) or in the collector
of a ``pytest:`` matrix target alike; :func:`cells_for` turns it into one cell per world
size it asks for. Every cell runs the same case, :data:`CASE`, which runs the test by its
node id in the rank's own pytest session (re-created from :class:`PytestSession`).

Example::

    >>> t = PytestTest(nodeid="tests/test_x.py::TestA::test_b[2]", file="/r/tests/test_x.py",
    ...                dialect="torch", meshes=("1x2",))
    >>> slug_of(t.nodeid)
    'tests.test_x.py.TestA.test_b-2'
    >>> s = PytestSession(dir="/r", args=("tests",), rootdir="/r")
    >>> PytestSession.from_json(s.to_json()) == s
    True
    >>> from cpmatrix.matrix.schema import Platform
    >>> [c.id for c in cells_for([t], s, platform=Platform(name="cpu", backend="gloo",
    ...                                                     device="cpu"))]
    ['pytest[unit,1x2,fp64,autocast=off,reference,test=tests.test_x.py.TestA.test_b-2]@cpu']
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from cpmatrix.defaults import TIMEOUT_S
from cpmatrix.digest import canonical_json, cell_digest_from_parts
from cpmatrix.kinds.pytest.session_spec import KIND, PytestSession
from cpmatrix.matrix.cellid import format_cell_id
from cpmatrix.matrix.schema import MAX_TIMEOUT_S, PYTEST_CASE, Cell, Mesh, Platform

__all__ = [
    "CASE",
    "DIALECTS",
    "ISOLATED_TAG",
    "KIND",
    "PytestSession",
    "PytestTest",
    "cell_test",
    "cells_for",
    "slug_of",
]

#: The case every pytest cell runs (inside the rank's pytest session).
CASE: Final = PYTEST_CASE
#: The recognised ways a test asks for ranks (docs/pytest.md, "Dialects").
DIALECTS: Final = ("torch", "torch_continuous", "marker", "deepspeed", "local")
#: The tag of a test that opted out of sharing (``@pytest.mark.isolated_world``).
ISOLATED_TAG: Final = "isolated_world"
#: The timeout of a test that names none (MultiProcessTestCase's own default).
DEFAULT_TIMEOUT_S: Final = TIMEOUT_S

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


def slug_of(nodeid: str) -> str:
    """A node id as a cell id's ``test=`` value (letters, digits and ``_ . + -``).

    >>> slug_of("a/test_y.py::test_z[x y/1]")
    'a.test_y.py.test_z-x_y.1'
    """
    text = nodeid.replace("::", ".").replace("/", ".").replace("[", "-").replace("]", "")
    return _UNSAFE.sub("_", text).strip("_") or "test"


@dataclass(frozen=True, slots=True, kw_only=True)
class PytestTest:
    """One multi-rank test as collected: where it is, how it asks for ranks."""

    nodeid: str
    #: The test's file (absolute).
    file: str
    #: One of :data:`DIALECTS`.
    dialect: str
    #: The world of each cell, as ``RxC`` (a 4-rank test without a mesh: ``1x4``); a
    #: DeepSpeed-style ``world_size = [2, 4]`` asks for two.
    meshes: tuple[str, ...]
    #: The test's own timeout (a ``timeout`` marker, torch's per-test table), if any.
    timeout_s: int | None = None
    #: ``@pytest.mark.isolated_world``: a world of its own.
    isolated: bool = False
    #: The names of the test's markers (they become the cells' tags).
    markers: tuple[str, ...] = ()
    #: sha256 over the sources the test depends on (:mod:`~cpmatrix.kinds.pytest.sources`).
    digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PytestTest:
        return cls(nodeid=str(data["nodeid"]), file=str(data["file"]),
                   dialect=str(data["dialect"]), meshes=tuple(map(str, data["meshes"])),
                   timeout_s=None if data.get("timeout_s") is None else int(data["timeout_s"]),
                   isolated=bool(data.get("isolated", False)),
                   markers=tuple(map(str, data.get("markers", ()))),
                   digest=str(data.get("digest", "")))


def cell_test(cell: Cell) -> dict[str, str]:
    """A pytest cell's test: ``nodeid``, ``dialect`` and ``session`` (a
    :class:`PytestSession` as JSON); its ranks get it as ``CellSpec.pytest``."""
    data = json.loads(cell.pytest) if cell.pytest else {}
    return {k: str(v) for k, v in data.items()}


def _tag(name: str) -> str | None:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else None


def cells_for(tests: Iterable[PytestTest], session: PytestSession, *, platform: Platform,
              target: str = "pytest", level: str = "unit",
              timeout_s: int = DEFAULT_TIMEOUT_S, tags: Sequence[str] = ()) -> list[Cell]:
    """The cells of ``tests``: one per (test, world), ids unique, digests over the sources.

    ``timeout_s`` is the timeout of a test that names none. A slug two node ids share
    gets a short hash of each node id, so every id stays unique and stable.
    """
    tests = list(tests)
    slugs: dict[str, set[str]] = {}
    for t in tests:
        slugs.setdefault(slug_of(t.nodeid), set()).add(t.nodeid)
    session_json = session.to_json()
    platform_json = canonical_json(platform.to_dict())
    cells: list[Cell] = []
    for t in tests:
        slug = slug_of(t.nodeid)
        if len(slugs[slug]) > 1:
            slug = f"{slug}-{hashlib.sha256(t.nodeid.encode()).hexdigest()[:8]}"
        source = bytes.fromhex(t.digest) if t.digest else hashlib.sha256(b"").digest()
        marker_tags = [m for m in map(_tag, t.markers) if m]
        cell_tags = tuple(dict.fromkeys([*tags, *marker_tags, t.dialect,
                                         *([ISOLATED_TAG] if t.isolated else [])]))
        for mesh in t.meshes:
            parsed = Mesh.parse(mesh)
            fields: dict[str, Any] = {
                "id": format_cell_id(target, level, str(parsed), "fp64", False, "reference",
                                     (("test", slug),), platform.name),
                "target": target, "case": CASE, "kind": KIND, "level": level,
                "mesh": parsed, "dtype": "fp64", "autocast": False, "path": "reference",
                "params": (("test", slug),),
                # What the rank needs to run it: in the digest, not in the id.
                "pytest": canonical_json({"nodeid": t.nodeid, "dialect": t.dialect,
                                          "session": session_json}),
                "platform": platform.name,
                "timeout_s": min(MAX_TIMEOUT_S, max(1, t.timeout_s or timeout_s)),
                "tags": cell_tags,
            }
            spec = Cell(**fields).to_dict()
            del spec["digest"]
            fields["digest"] = cell_digest_from_parts(canonical_json(spec), source,
                                                      platform_json)
            cells.append(Cell(**fields))
    return cells
