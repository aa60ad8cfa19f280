"""The spare fork launcher of ``pytest --cpmatrix`` (``cpmatrix.supervise.executors.spare``):
started at configure, taken by the first world that fits, never left behind."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cpmatrix.supervise.executors.launch import launcher_argv
from cpmatrix.supervise.executors.spare import Spare
from cpmatrix.supervise.runners.base import Launch
from cpmatrix.supervise.runners.local import LocalRunner
from cpmatrix.worker.procs import WORLD_TOKEN
from pytest_front_runs import pytest_run

pytestmark = pytest.mark.slow


def _spares() -> list[int]:
    """Processes of this machine that carry a spare's token."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"{WORLD_TOKEN}=spare/".encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _own_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


def test_the_first_world_takes_the_spare_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = set(_spares())
    tmp = _own_tmp(monkeypatch, tmp_path)
    out = tmp_path / "out"
    run = pytest_run(["--cpmatrix", f"--cpmatrix-out={out}", "shapes/test_property_world.py"],
                     tmp_path / "front.xml")
    assert set(run.outcomes.values()) == {"passed"} and len(run.outcomes) == 2, run.output
    (command,) = out.glob("worlds/*/command.json")
    assert json.loads(command.read_text())["spare"] is True
    # Its log is the world's launcher log, as a launcher the world started itself.
    (log,) = out.glob("worlds/*/torchrun.log")
    assert "imported" in log.read_text()
    assert set(_spares()) <= before
    assert not list(tmp.glob("cpmatrix-spare-*"))


def test_a_run_without_multi_rank_tests_ends_its_spare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = set(_spares())
    tmp = _own_tmp(monkeypatch, tmp_path)
    run = pytest_run(["--cpmatrix", f"--cpmatrix-out={tmp_path / 'out'}",
                      "plain/test_plain.py", "-k", "not pair"], tmp_path / "front.xml")
    assert run.rc == 0 and len(run.outcomes) == 3, run.output
    assert set(_spares()) <= before
    assert not list(tmp.glob("cpmatrix-spare-*"))


def test_a_world_whose_environment_differs_does_not_take_it(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1"}
    spare = Spare.start(sys.executable, env, (), ("/a",))
    try:
        launch = Launch(argv=launcher_argv("fork", sys.executable, 2, 1, "w.json"),
                        env={**spare.env, "PYTHONPATH": "/b"}, cwd=str(tmp_path))
        assert spare.take(launch, LocalRunner(), tmp_path / "log") is None
        assert spare.why_not == "the environment differs in PYTHONPATH"
        other = Launch(argv=launcher_argv("torchrun", sys.executable, 2, 1, "w.json"),
                       env=dict(spare.env), cwd=str(tmp_path))
        assert spare.take(other, LocalRunner(), tmp_path / "log") is None
        assert spare.why_not == "not the fork launcher of this interpreter"
        assert spare.proc.poll() is None
    finally:
        spare.close()
    assert spare.proc.poll() is not None
    assert not spare.folder.exists()
