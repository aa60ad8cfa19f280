"""Faults under ``pytest --cpmatrix``: each fails only its own test, naming the rank.

One run of ``tests/resources/pytest_front_suites/faults``: a hang in a collective, a rank
killed mid-test, a torch function replaced and left so, beside healthy tests that share
their worlds (and rerun in a fresh one after each fault) and one that asked for a world
of its own. Then Ctrl-C in the middle of a run, and pytest's -k, -x and --lf.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cpmatrix.worker.procs import processes_with_token
from pytest_front_runs import SUITES, Run, env, pytest_run, read_junit

pytestmark = pytest.mark.slow

FAULTS = "faults.test_faults"


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    tmp = tmp_path_factory.mktemp("faults")
    run = pytest_run(["--cpmatrix", "--cpmatrix-out", str(tmp / "out"), "-rA", "faults"],
                     tmp / "faults.xml")
    return run, tmp / "out"


def left_behind(out: Path) -> list[int]:
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    return processes_with_token(f"{run_id}/", prefix=True)


def test_each_fault_fails_only_its_own_test(faults: tuple[Run, Path]) -> None:
    run, out = faults
    assert run.rc == 1, run.output[-4000:]
    assert run.outcomes == {
        **{f"{FAULTS}::test_neighbour[{k}]": "passed" for k in range(3)},
        f"{FAULTS}::test_planted_hang": "failed",
        f"{FAULTS}::test_planted_crash": "failed",
        # Passed; what it left behind is noted (as natively, not its outcome).
        f"{FAULTS}::test_planted_leak": "passed",
        f"{FAULTS}::test_assert_close_is_real": "passed",
        **{f"{FAULTS}::test_isolated[{k}]": "passed" for k in range(2)},
    }, run.output[-4000:]
    assert left_behind(out) == []


def test_a_hang_names_the_rank_and_where_it_hung(faults: tuple[Run, Path]) -> None:
    run, _ = faults
    text = run.texts[f"{FAULTS}::test_planted_hang"]
    assert "the test hung: cell ran past its timeout of 6 s" in text
    assert "rank 1 of 2 was still in it" in text
    source = (SUITES / "faults" / "test_faults.py").read_text().splitlines()
    line = next(i for i, t in enumerate(source, 1) if "rank 0 never joins" in t)
    assert f"rank 1 was at test_faults.py:{line} in test_planted_hang" in text
    # Every rank's stack: rank 1 in the collective, rank 0 done and waiting.
    assert "Captured stacks rank 1" in run.output and "in all_reduce" in run.output
    assert "Captured stacks rank 0" in run.output


def test_a_crash_names_the_rank_and_how_it_died(faults: tuple[Run, Path]) -> None:
    run, _ = faults
    text = run.texts[f"{FAULTS}::test_planted_crash"]
    assert "rank 1 of 2 died during the test" in text
    assert "killed by signal SIGKILL" in text
    assert "failed again when retried alone" in text


def test_state_left_behind_is_named_on_the_test_that_left_it(faults: tuple[Run, Path]) -> None:
    run, _ = faults
    # A warning of that test, in pytest's warnings summary.
    warning = run.output[run.output.index("warnings summary"):]
    assert "test_planted_leak" in warning
    assert ("LeftStateWarning: cpmatrix: the test left state behind in its ranks' process"
            in warning)
    assert "process_state: the case replaced or deleted torch.testing.assert_close" in warning
    # The test that checks assert_close is real ran in a world the leak never reached.
    assert run.outcomes[f"{FAULTS}::test_assert_close_is_real"] == "passed"


def test_ctrl_c_stops_the_worlds_and_reports_what_finished(tmp_path: Path) -> None:
    out, junit = tmp_path / "out", tmp_path / "interrupt.xml"
    # Four ranks: the slow test and the quick one side by side.
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--cpmatrix",
         "--cpmatrix-out", str(out), "--cpmatrix-world-ranks", "4", f"--junitxml={junit}",
         "interrupt"], cwd=SUITES, env={**env(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    chunks: queue.Queue[bytes] = queue.Queue()

    def read() -> None:  # -v ends a test's line only when the next one starts: chunks
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(4096):
            chunks.put(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen = b""
    deadline = time.monotonic() + 600
    try:
        while b"test_quick PASSED" not in seen:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            try:
                seen += chunks.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, seen.decode(errors="replace")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    assert proc.stdout is not None
    proc.stdout.close()
    while not chunks.empty():
        seen += chunks.get()
    output = seen.decode(errors="replace")
    assert proc.returncode == 2, output
    assert "KeyboardInterrupt" in output
    outcomes, _ = read_junit(junit)
    assert outcomes == {"interrupt.test_interrupt::test_quick": "passed"}, (outcomes, output)
    assert left_behind(out) == []


def test_select_stop_first_and_rerun_the_last_failed(tmp_path: Path) -> None:
    cache = ["-o", f"cache_dir={tmp_path / 'cache'}", "-p", "cacheprovider"]
    selected = "allreduce or fails_on_rank_zero or sharded_sum"
    first = pytest_run([*cache, "--cpmatrix", "--cpmatrix-out", str(tmp_path / "out1"),
                        "-k", selected, "-x", "dialects/test_marker_dialect.py"],
                       tmp_path / "first.xml")
    assert first.rc == 1, first.output[-3000:]
    assert "stopping after 1 failures" in first.output
    assert "dialects.test_marker_dialect::test_fails_on_rank_zero" in first.outcomes
    names = {k.split("::")[1].split("[")[0] for k in first.outcomes}
    assert names <= {"test_allreduce", "test_fails_on_rank_zero", "test_sharded_sum"}
    again = pytest_run([*cache, "--cpmatrix", "--cpmatrix-out", str(tmp_path / "out2"),
                        "--lf", "dialects/test_marker_dialect.py"], tmp_path / "again.xml")
    assert again.outcomes == {"dialects.test_marker_dialect::test_fails_on_rank_zero":
                              "failed"}, again.output[-3000:]
