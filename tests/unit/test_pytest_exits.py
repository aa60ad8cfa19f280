"""``pytest.exit()`` reported by a rank: which tests the controller still reports and
when it stops the worlds (:class:`cpmatrix.kinds.pytest.exits.SessionExit`)."""

from __future__ import annotations

import doctest

from cpmatrix.kinds.pytest import exits
from cpmatrix.kinds.pytest.exits import SessionExit

ORDER = ["t::a", "t::b", "t::c", "t::d"]


def _exit(msg: str, code: object = 3) -> dict[int, dict[str, object]]:
    return {0: {"phases": []}, 1: {"phases": [], "exit": {"msg": msg, "returncode": code}}}


def test_the_tests_before_the_exit_are_reported_those_after_it_not() -> None:
    ends = SessionExit(ORDER)
    assert ends.reports("t::d") and ends.exit is None
    assert not ends.note("t::a", {0: {"phases": []}})  # no rank exited
    assert ends.note("t::c", _exit("bye"))
    assert ends.exit == ("bye", 3)
    assert [ends.reports(n) for n in ORDER] == [True, True, False, False]


def test_the_earliest_exit_in_the_sessions_order_wins_as_natively() -> None:
    # The worlds finish tests out of order: an exit of a later test seen first gives
    # way to an earlier one's (natively the earlier one ended the session first).
    ends = SessionExit(ORDER)
    ends.note("t::d", _exit("late", 4))
    ends.note("t::b", _exit("early", None))
    assert ends.exit == ("early", None)
    assert [ends.reports(n) for n in ORDER] == [True, False, False, False]
    ends.note("t::c", _exit("later still"))
    assert ends.exit == ("early", None)


def test_the_worlds_stop_once_nothing_before_the_exit_is_left() -> None:
    ends = SessionExit(ORDER)
    assert not ends.settled({})  # no exit: the run goes on
    ends.note("t::c", _exit("bye"))
    assert not ends.settled({"t::a": ["cell-a"], "t::d": ["cell-d"]})
    assert ends.settled({"t::a": [], "t::b": [], "t::d": ["cell-d"]})


def test_a_return_code_that_is_not_an_int_is_none() -> None:
    ends = SessionExit(ORDER)
    ends.note("t::a", _exit("bye", "3"))
    assert ends.exit == ("bye", None)


def test_doctests_run() -> None:
    assert doctest.testmod(exits).failed == 0
