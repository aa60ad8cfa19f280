"""``pytest.exit()`` in a rank, where natively it ends the pytest session.

Natively a pytest fixture, a ``setUp`` of a spawning class and a DeepSpeed-style test
(its launcher re-raises what a rank raised) run their ``pytest.exit()`` in the pytest
process: the session ends there, with the exit's message and return code; the test that
called it has no report, the tests before it (in the session's order) ran and are
reported, the tests after it never run. (Inside a spawned torch worker it is a failure
of the test: :mod:`cpmatrix.kinds.pytest.rank_dialects`.)

The ranks run the tests in the worlds' order, side by side: a rank records the exit in
its report file (``"exit"``) and its session goes on; the controller, told by
:class:`SessionExit`, reports the tests before the exiting one as they finish, drops
the ones after it, stops the worlds once nothing before it is left, and ends its own
session with the same message and return code.

Example::

    >>> ends = SessionExit(["a", "b", "c"])
    >>> ends.note("b", {0: {"exit": {"msg": "bye", "returncode": 3}}})
    True
    >>> ends.reports("a"), ends.reports("c"), ends.exit
    (True, False, ('bye', 3))
    >>> ends.settled({"a": ["cell-a"], "c": ["cell-c"]}), ends.settled({"a": [], "c": ["x"]})
    (False, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SessionExit"]


class SessionExit:
    """The earliest ``pytest.exit()`` the ranks reported, in the session's test order."""

    def __init__(self, order: Sequence[str]) -> None:
        self._index = {nodeid: i for i, nodeid in enumerate(order)}
        self._at: int | None = None
        #: (message, return code) of the exit that ends the session; None without one.
        self.exit: tuple[str, int | None] | None = None

    def note(self, nodeid: str, records: Mapping[int, Mapping[str, Any]]) -> bool:
        """Whether a rank of ``nodeid``'s cell called ``pytest.exit()`` (kept when it
        comes before the one kept so far: natively the first one ends the session)."""
        exits = [r["exit"] for r in records.values() if isinstance(r.get("exit"), dict)]
        if not exits:
            return False
        at = self._index.get(nodeid, len(self._index))
        if self._at is None or at < self._at:
            code = exits[0].get("returncode")
            self._at = at
            self.exit = (str(exits[0].get("msg", "")), code if isinstance(code, int) else None)
        return True

    def reports(self, nodeid: str) -> bool:
        """Whether ``nodeid``'s outcome is reported (natively it ran before the exit)."""
        return self._at is None or self._index.get(nodeid, len(self._index)) < self._at

    def settled(self, pending: Mapping[str, Sequence[str]]) -> bool:
        """After an exit, whether every test before it has finished (``pending``: each
        test's cells still running): then the worlds stop."""
        if self._at is None:
            return False
        return not any(cells for nodeid, cells in pending.items() if self.reports(nodeid))
