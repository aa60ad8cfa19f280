"""``pytest --cpmatrix`` on suites written in each dialect, against their native runs.

One ``--cpmatrix`` run over ``tests/resources/pytest_front_suites/dialects`` (torch's
``MultiProcessTestCase`` family, ``@pytest.mark.world``, DeepSpeed-style classes) and the
native runs of the same tests (torch's harness spawning its ranks per test; torchrun
running pytest on every rank; the DeepSpeed-style conftest launching processes): each
test must end the same way. The native torch run takes a subset (each of its tests pays
a spawn of its ranks); ``benchmarks/pytest_front.py`` compares every test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_front_runs import Run, pytest_run, torchrun_run

pytestmark = pytest.mark.slow

#: The torch-dialect tests run natively too: a pass, a failure on one rank, an expected
#: failure, a skip decided by a torch skip decorator, and MultiProcContinuousTest.
TORCH_NATIVE = ("test_add_sharded or test_fails_on_rank_one or test_expected_failure or "
                "test_needs_two_gpus or ContinuousTest")


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("front")
    return pytest_run(["--cpmatrix", "--cpmatrix-out", str(tmp / "out"), "-rA",
                       "--durations=3", "dialects"], tmp / "front.xml")


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("native")
    return {
        "torch": pytest_run(["-k", TORCH_NATIVE, "dialects/test_torch_dialect.py"],
                            tmp / "torch.xml"),
        "marker": torchrun_run(2, ["dialects/test_marker_dialect.py"], tmp / "marker"),
        "deepspeed": pytest_run(["dialects/deepspeed"], tmp / "deepspeed.xml"),
    }


def test_every_test_ends_as_it_does_natively(front: Run, native: dict[str, Run]) -> None:
    assert front.rc == 1, front.output[-3000:]
    compared = 0
    for dialect, run in native.items():
        assert run.outcomes, (dialect, run.output[-3000:])
        mine = {k: front.outcomes.get(k) for k in run.outcomes}
        assert mine == run.outcomes, (dialect, run.output[-2000:], front.output[-3000:])
        compared += len(mine)
    assert compared >= 20
    # Every kind of outcome is among them: the comparison is not of passes alone.
    seen = set(front.outcomes.values())
    assert {"passed", "failed", "skipped", "xfailed"} <= seen
    # The cell fixture holds the user's view on both sides (no cpmatrix internals in its
    # params, its platform the device's): passed, not failed alike.
    fixture = "dialects.test_marker_dialect::test_cell_fixture"
    assert front.outcomes[fixture] == native["marker"].outcomes[fixture] == "passed"


def test_the_front_ran_every_test_of_the_suite(front: Run) -> None:
    # 29, and the 2 of dialects/deepspeed_groups (compared natively in the shapes tests).
    assert len(front.outcomes) == 31, sorted(front.outcomes)
    torch_only = {k: v for k, v in front.outcomes.items() if "test_torch_dialect" in k}
    # The torch tests not run natively here (see benchmarks/pytest_front.py for all).
    assert torch_only["dialects.test_torch_dialect.PairTest::test_env_from_setup"] == "passed"
    assert torch_only["dialects.test_torch_dialect.OwnGroupTest::test_allgather_own_group"] \
        == "passed"
    assert torch_only["dialects.test_torch_dialect.QuadTest::test_matmul_colwise"] == "passed"
    assert torch_only["dialects.test_torch_dialect.PairTest::test_skips_itself"] == "skipped"


def test_a_failure_is_the_failing_ranks_own_report(front: Run) -> None:
    torch_fail = front.texts["dialects.test_torch_dialect.PairTest::test_fails_on_rank_one"]
    assert "planted mismatch on rank 1" in torch_fail
    marker_fail = front.texts["dialects.test_marker_dialect::test_fails_on_rank_zero"]
    assert "planted failure on rank 0" in marker_fail and "assert 0 != 0" in marker_fail
    # The failure block says which ranks failed and shows every rank's log.
    out = front.output
    assert "failed on rank 0, passed on rank 1" in out
    assert "Captured rank 1 log" in out and "Captured rank 0 log" in out
    # cpmatrix's own worker traceback of a failing test is not shown: pytest's report is.
    assert "PytestFailure" not in out


def test_pytest_reporting_options_work(front: Run) -> None:
    out = front.output
    assert "slowest 3 durations" in out
    assert "XPASS dialects/test_marker_dialect.py::test_unexpected_pass" in out
    assert "SKIPPED [1] dialects/test_torch_dialect.py" in out
    # The one local test and the DeepSpeed-style class without init_distributed ran here.
    assert "cpmatrix: 29 multi-rank tests in" in out


def test_xdist_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    run = pytest_run(["--cpmatrix", "-n", "2", "plain"], tmp_path / "x.xml")
    assert run.rc == 4, run.output
    assert "--cpmatrix cannot be combined with pytest-xdist" in run.output


def test_without_cpmatrix_world_tests_say_how_to_run_them(tmp_path: Path) -> None:
    run = pytest_run(["-rs", "plain"], tmp_path / "plain.xml")
    assert run.rc == 0, run.output
    assert run.outcomes["plain.test_plain::test_pair"] == "skipped"
    assert "needs a world of 2 ranks: run with pytest --cpmatrix" in run.output
