"""The Slurm scheduler's pure parts: the srun command, job names, squeue/sacct rows
(the parts that need a cluster are in tests/e2e/test_slurm.py)."""

from __future__ import annotations

import doctest

import pytest

from cpmatrix.plan import balance
from cpmatrix.report import merge
from cpmatrix.supervise import sharding
from cpmatrix.supervise.runners.base import Launch
from cpmatrix.supervise.runners.local import LocalRunner
from cpmatrix.supervise.schedulers import slurm
from cpmatrix.supervise.schedulers.slurm import JobState, SlurmRunner, job_name, parse_states
from cpmatrix.supervise.settings import SlurmSettings
from cpmatrix.worker.procs import WORLD_TOKEN


@pytest.mark.parametrize("module", [balance, sharding, slurm, merge])
def test_doctests_run(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.failed == 0 and result.attempted > 0


def _launch(devices: tuple[int, ...] = ()) -> Launch:
    return Launch(argv=("python", "-m", "torch.distributed.run"), cwd="/",
                  env={WORLD_TOKEN: "r1/000-cuda-w2-b0.a1", "CUDA_VISIBLE_DEVICES": "0,1",
                       "PATH": "/usr/bin"}, devices=devices)


def test_a_cuda_world_asks_slurm_for_its_gpus_and_not_for_this_hosts() -> None:
    runner = SlurmRunner(LocalRunner(), SlurmSettings(account="team", extra_args=("--qos=x",)))
    argv, env = runner.command(_launch(devices=(0, 1)))
    assert argv[:6] == ["srun", "--job-name=cpmatrix-r1-000-cuda-w2-b0.a1", "--nodes=1",
                        "--ntasks=1", "--kill-on-bad-exit=1", "--export=ALL"]
    assert "--gres=gpu:2" in argv and "--account=team" in argv
    assert argv.index("--qos=x") < argv.index("python"), "srun's options before the command"
    assert "CUDA_VISIBLE_DEVICES" not in env and env["PATH"] == "/usr/bin"
    assert runner.submitted == ["cpmatrix-r1-000-cuda-w2-b0.a1"]
    assert runner.shares_pid_namespace is False, "another node's pids are never signalled"
    assert runner.identity() == LocalRunner().identity(), "cached passes are shared"


def test_a_cpu_world_keeps_its_environment_and_asks_no_gpu() -> None:
    argv, env = SlurmRunner(LocalRunner(), SlurmSettings()).command(_launch())
    assert not any(a.startswith("--gres") for a in argv)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_job_names_are_safe_for_squeue() -> None:
    launch = Launch(argv=(), cwd="/", env={WORLD_TOKEN: "ab/0 01,x"})
    assert job_name(launch) == "cpmatrix-ab-0-01-x", "no ',' (squeue --name splits on it)"


def test_state_rows_from_squeue_and_sacct() -> None:
    assert parse_states("w|7|CANCELLED by 0|None\nw|9|RUNNING|None\n|||\nbad\n") == {
        "w": JobState(job_id="9", state="RUNNING", reason="None")}
