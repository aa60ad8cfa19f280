"""The collector of a ``pytest:`` matrix target (a subprocess; the tests import torch).

Usage (:mod:`cpmatrix.kinds.pytest.collect` runs it, in the matrix file's folder)::

    python -m cpmatrix.kinds.pytest.collect_main OUT.json -- tests/dist tests/x.py::test_y

Collects the tests as ``pytest --collect-only`` would and writes to ``OUT.json`` how a
rank re-creates the session and every test, multi-rank or not (a test that needs no ranks
becomes a cell of one rank), with the dialect, worlds, timeout and sources' digest of each
(:mod:`cpmatrix.kinds.pytest.items`). Exit code: pytest's.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.kinds.pytest.items import session_of, tests_of
from cpmatrix.module_names import PYTEST_COLLECTOR

__all__ = ["main"]


class _Collector:
    def __init__(self, out: str, args: list[str]) -> None:
        self.out = out
        self.args = args

    def pytest_collection_finish(self, session: Any) -> None:
        _, tests = tests_of(session.items, session.config, every=True)
        atomic_write_json(self.out, {
            "session": session_of(session.config, self.args).to_json(),
            "tests": [t.to_dict() for t in tests],
        })


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[1] != "--":
        print(f"usage: python -m {PYTEST_COLLECTOR} OUT.json -- PATH...",
              file=sys.stderr)
        return 4
    out, paths = args[0], args[2:]
    return int(pytest.main([*paths, "--collect-only", "-q", "-p", "no:cacheprovider"],
                           plugins=[_Collector(out, paths)]))


if __name__ == "__main__":
    sys.exit(main())
