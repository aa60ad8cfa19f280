"""A pytest session's collected items as the front's records (plugin and collector alike).

:func:`tests_of` splits the items pytest collected into those that run as usual and the
multi-rank tests (:class:`~cpmatrix.kinds.pytest.spec.PytestTest`, each with the digest of
the sources it depends on); :func:`session_of` records how a rank re-creates the session.
The ``--cpmatrix`` controller and the collector of a ``pytest:`` matrix target both use
them: the same tests, the same cells.

Example (in a pytest hook)::

    local, tests = tests_of(session.items, session.config)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from cpmatrix.kinds.pytest.dialects import DialectError, Placement, placement, timeout_of
from cpmatrix.kinds.pytest.sources import SourceDigests
from cpmatrix.kinds.pytest.spec import PytestSession, PytestTest

__all__ = ["session_of", "tests_of"]


def session_of(config: Any, args: Sequence[str] | None = None) -> PytestSession:
    """How a rank re-creates this pytest session (``args``: the command line to record,
    by default the one pytest was given)."""
    given = tuple(config.invocation_params.args) if args is None else tuple(args)
    return PytestSession(dir=str(config.invocation_params.dir), args=given,
                         rootdir=str(config.rootpath), sys_path=tuple(sys.path),
                         inifile=str(config.inipath) if config.inipath else "")


def _file(item: Any) -> str:
    return str(Path(str(item.path)).resolve())


def _markers(item: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(m.name for m in item.iter_markers()))


def _test(item: Any, found: Placement, digest: str) -> PytestTest:
    return PytestTest(nodeid=item.nodeid, file=_file(item), dialect=found.dialect,
                      meshes=found.meshes, timeout_s=found.timeout_s,
                      isolated=found.isolated, markers=_markers(item), digest=digest)


def tests_of(items: Sequence[Any], config: Any, *, every: bool = False,
             notes: list[str] | None = None) -> tuple[list[Any], list[PytestTest]]:
    """(the items that run as usual, the multi-rank tests), in the items' order; with
    ``every`` (a ``pytest:`` matrix target runs every test it collects) a test that needs
    no ranks is a test too, a cell of one rank. A test whose ranks cannot be read is a
    usage error naming it; a torch-harness test run natively instead adds its one-line
    note to ``notes``."""
    local: list[Any] = []
    tests: list[PytestTest] = []
    digests = SourceDigests(str(config.rootpath), sys.path)  # one for all: files read once
    for item in items:
        try:
            found = placement(item)
            if found is not None and found.dialect == "native":
                if notes is not None:
                    notes.append(found.note)
                found = None
            if found is None and every:
                found = Placement("local", ("1x1",), timeout_of(item),
                                  item.get_closest_marker("isolated_world") is not None)
        except DialectError as exc:
            raise pytest.UsageError(f"cpmatrix: {exc}") from None
        if found is None:
            local.append(item)
        else:
            tests.append(_test(item, found, digests.digest(_file(item))))
    return local, tests
