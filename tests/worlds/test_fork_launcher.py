"""The fork launcher (``cpmatrix.worker.forkrun``) on its own: the ranks it forks get
torchrun's variables, die with it, and the first failing rank is named; it refuses to
fork once a thread exists. (Through the product, every world test runs on it: it is the
default ``--launcher``.) The first failing rank is a typed record for the supervisor
(``--root-cause-file``) and torchrun's "Root Cause" block in the log for people."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import run_cli, wait_for
from cpmatrix.supervise.executors.attribution import torchrun_root_cause
from cpmatrix.worker.protocol import RootCause, WorldFolder, read_typed

RES = Path(__file__).parents[1] / "resources" / "fork"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(out: Path, module: str, *args: str) -> subprocess.Popen[bytes]:
    """The launcher with 3 ranks; its output goes to ``out/launcher.log`` (a file, not a
    pipe: a rank that outlived it would hold a pipe open)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(RES), os.environ.get(
        "PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    with open(out / "launcher.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cpmatrix.worker.forkrun", "--nproc-per-node=3",
             f"--master-port={free_port()}", f"--root-cause-file={out / 'cause.json'}",
             "-m", module, str(out), *args],
            env=env, stdout=log, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen[bytes], out: Path) -> str:
    proc.wait(timeout=300)
    return (out / "launcher.log").read_text()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def rank_pids(out: Path) -> list[int]:
    return [int((out / f"rank{r}.pid").read_text().split()[0]) for r in range(3)]


def test_ranks_get_torchruns_variables_and_exit_cleanly(tmp_path: Path) -> None:
    proc = launch(tmp_path, "fork_targets", "ok")
    output = finish(proc, tmp_path)
    assert proc.returncode == 0, output
    assert not (tmp_path / "cause.json").exists()  # no rank failed
    lines = [(tmp_path / f"rank{r}.pid").read_text().split() for r in range(3)]
    assert {size for _, size, _ in lines} == {"3"}
    assert len({pid for pid, _, _ in lines}) == 3


def test_sigkill_of_the_launcher_takes_every_rank_down(tmp_path: Path) -> None:
    proc = launch(tmp_path, "fork_targets", "sleep")
    try:
        wait_for("3 ranks", lambda: len(list(tmp_path.glob("rank*.pid"))) == 3, timeout=300)
        wait_for("rank pid files written", lambda: all(
            p.read_text().endswith("\n") for p in tmp_path.glob("rank*.pid")))
        pids = rank_pids(tmp_path)
        assert all(alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # The parent-death signal, set in each rank right after the fork.
        wait_for("the ranks to die", lambda: not any(alive(p) for p in pids), timeout=20)
    finally:
        proc.kill()
        proc.wait()


def test_the_first_failing_rank_is_named_and_the_others_are_killed(tmp_path: Path) -> None:
    proc = launch(tmp_path, "fork_targets", "exit7_rank1")
    output = finish(proc, tmp_path)
    assert proc.returncode == 1, output
    cause = read_typed(tmp_path / "cause.json", RootCause)
    pids = rank_pids(tmp_path)
    assert cause is not None and (cause.rank, cause.exitcode, cause.pid) == (1, 7, pids[1])
    # The same rank, as people read it in the launcher's log (torchrun's own block).
    assert torchrun_root_cause(output) == (1, "exited with code 7"), output
    assert not any(alive(p) for p in pids)


def test_it_refuses_to_fork_once_a_thread_exists(tmp_path: Path) -> None:
    proc = launch(tmp_path, "fork_threaded")
    output = finish(proc, tmp_path)
    assert proc.returncode == 3, output
    assert "refusing to fork: 2 threads" in output
    assert not list(tmp_path.glob("rank*.pid"))


@pytest.mark.slow
def test_profile_is_a_run_option_the_ranks_read_from_the_world_file(tmp_path: Path) -> None:
    """``--profile`` reaches the ranks through the world file (``WorldSpec.profile``), not
    the environment: each rank prints one PROFILE line per cell into its log."""
    matrix = Path(__file__).parents[1] / "resources" / "basic.yaml"
    select = ("-k", "alpha and 1x1 and fp64 and autocast=off and seq=7", "--no-cache")
    for profile in (True, False):
        out = tmp_path / f"profile-{profile}"
        proc = run_cli("run", "--matrix", str(matrix), *select, "--out", str(out),
                       *(["--profile"] if profile else []))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (world,) = [w for w in (out / "worlds").iterdir() if w.is_dir()]
        folder = WorldFolder(world)
        assert json.loads(folder.world_file.read_text())["profile"] is profile
        log = folder.rank_log(0).read_text()
        assert ("PROFILE env=" in log) is profile, log


def test_a_thread_started_by_the_worlds_early_imports_means_new_processes(
    tmp_path: Path,
) -> None:
    # Alone before before_fork, not after it: the ranks are started as new interpreters
    # (as torchrun does), never forked beside a thread.
    proc = launch(tmp_path, "fork_threaded_late")
    output = finish(proc, tmp_path)
    assert proc.returncode == 0, output
    assert "starting the ranks as new processes" in output
    lines = [(tmp_path / f"rank{r}.pid").read_text().split() for r in range(3)]
    assert {size for _, size, _ in lines} == {"3"}
    # Each rank imported the target itself: not a fork of the launcher.
    assert all(pid == imported for pid, _, imported in lines), lines
