"""The launcher setting: its flag, its validation, the command each launcher runs."""

from __future__ import annotations

import argparse

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.supervise.executors.launch import launcher_argv
from cpmatrix.supervise.options import LAUNCHERS, RunOptions, add_run_arguments


def test_fork_is_the_default_and_the_flag_offers_both() -> None:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    assert RunOptions.from_namespace(p.parse_args([])).launcher == "fork"
    assert RunOptions.from_namespace(
        p.parse_args(["--launcher", "torchrun"])).launcher == "torchrun"
    with pytest.raises(SystemExit) as exc:  # argparse: exit 2, naming the choices
        p.parse_args(["--launcher", "mpirun"])
    assert exc.value.code == 2


def test_an_unknown_launcher_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--launcher must be one of fork, torchrun"):
        RunOptions(launcher="mpirun")


@pytest.mark.parametrize(
    ("launcher", "module", "only_torchrun"),
    [("fork", "cpmatrix.worker.forkrun", False), ("torchrun", "torch.distributed.run", True)],
)
def test_each_launcher_runs_the_worker_on_the_ranks_on_loopback(
        launcher: str, module: str, only_torchrun: bool) -> None:
    assert launcher in LAUNCHERS
    argv = launcher_argv(launcher, "py", 4, 1234, "w.json")
    assert argv[:3] == ("py", "-m", module)
    assert argv[-3:] == ("-m", "cpmatrix.worker.world_main", "w.json")
    assert {"--nproc-per-node=4", "--master-addr=127.0.0.1", "--master-port=1234"} <= set(argv)
    assert ("--max-restarts=0" in argv) is only_torchrun
