"""The rank's command line (pytest-timeout's options dropped, whatever their form) and the
worker's own traceback of a failing pytest cell, cut from a rank's log."""

from __future__ import annotations

import pytest

from cpmatrix.kinds.pytest.rank_session import RANK_ARGS, pinned_args, rank_args
from cpmatrix.kinds.pytest.reports import _WORKER_BLOCK
from cpmatrix.kinds.pytest.spec import PytestSession


@pytest.mark.parametrize("args, kept", [
    (["tests", "--timeout", "5", "-x"], ["tests", "-x"]),
    (["tests", "--timeout=5", "-x"], ["tests", "-x"]),
    (["--timeout_method", "thread", "--timeout-method=signal", "t"], ["t"]),
    (["--session-timeout", "60", "t"], ["t"]),
    # Flags take no value: the argument after them stays.
    (["--timeout-disable-debugger-detection", "t"], ["t"]),
    (["--timeout_func_only", "t", "--timeout-func-only", "u"], ["t", "u"]),
    # Options that merely start alike are not pytest-timeout's.
    (["--timeouts", "3", "t"], ["--timeouts", "3", "t"]),
    (["-k", "timeout", "t"], ["-k", "timeout", "t"]),
])
def test_pytest_timeouts_options_are_dropped_from_a_ranks_command_line(
        args: list[str], kept: list[str]) -> None:
    assert rank_args(args) == [*kept, *RANK_ARGS]


def test_the_controllers_rootdir_and_inifile_are_pinned_in_a_rank() -> None:
    spec = PytestSession(dir="/r", args=("t", "--cpmatrix-out", "/o"), rootdir="/r/s",
                         inifile="/r/s/tox.ini")
    assert pinned_args(spec) == ["t", "--cpmatrix-out", "/o", *RANK_ARGS, "--rootdir=/r/s",
                                 "-c", "/r/s/tox.ini"]
    no_ini = PytestSession(dir="/r", args=("t",), rootdir="/r")
    assert pinned_args(no_ini) == ["t", *RANK_ARGS, "--rootdir=/r"]
    # Recorded by the collector, read back by the rank.
    assert PytestSession.from_json(spec.to_json()) == spec


def test_pytest_timeout_is_off_and_output_uncaptured_in_a_rank() -> None:
    assert RANK_ARGS == ("-p", "no:timeout", "--capture=no")


TAIL = """\
before the test
cpmatrix worker: cell s[unit,1x2,test=a] failed on rank 1:
Traceback (most recent call last):
  File "/x/cpmatrix/worker/worker.py", line 10, in run
    case(cell)
  File "/x/cpmatrix/kinds/pytest/rank_session.py", line 20, in case
    raise PytestFailure(text)
cpmatrix.kinds.pytest.rank_session.PytestFailure: test failed: see its report
after the test
"""


def test_the_workers_traceback_of_a_failing_test_is_cut_from_the_log() -> None:
    assert _WORKER_BLOCK.sub("", TAIL) == "before the test\nafter the test\n"
    # Without the worker's header line (a rank whose log starts with the traceback).
    headless = TAIL.replace("cpmatrix worker: cell s[unit,1x2,test=a] failed on rank 1:\n", "")
    assert _WORKER_BLOCK.sub("", headless) == "before the test\nafter the test\n"


def test_a_traceback_that_is_not_the_workers_stays() -> None:
    other = ("Traceback (most recent call last):\n  File \"t.py\", line 1, in f\n"
             "ValueError: the test's own\n")
    assert _WORKER_BLOCK.sub("", other) == other


def test_a_traceback_the_test_printed_before_the_workers_stays() -> None:
    printed = ("Traceback (most recent call last):\n  File \"t.py\", line 1, in f\n"
               "ValueError: printed by the test\n")
    assert _WORKER_BLOCK.sub("", printed + TAIL) == \
        printed + "before the test\nafter the test\n"


def test_a_session_error_stays_in_the_log() -> None:
    error = TAIL.replace("PytestFailure: test failed: see its report",
                         "SessionError: the rank's pytest session did not start:\nboom")
    assert _WORKER_BLOCK.sub("", error) == error
