"""Trust: no false PASS, no lost result, no orphan process (issue 11).

Each test is an adversarial scenario that made cpmatrix report PASS for failing code,
lose results, leave processes or delete files; each runs real gloo worlds through the
real CLI. ``tests/resources/trust.yaml`` runs once (module fixture) with --keep-order, so
every adversarial cell is followed by the cell it tries to fool.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from junitparser import JUnitXml

from cli_runner import (
    RES,
    parent_of,
    pid_alive,
    processes_with,
    results_by_target,
    run_cli,
    start_cli,
    stop,
    wait_for,
)

TRUST = RES / "trust.yaml"
SIGNALS = RES / "signals.yaml"


@pytest.fixture(scope="module")
def trust_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    out = tmp_path_factory.mktemp("trust") / "out"
    proc = run_cli("run", "--matrix", str(TRUST), "--keep-order", "--abort-grace", "2",
                   "--no-cache", "--plain", "--out", str(out))
    return proc.returncode, proc.stdout + proc.stderr, out


def _result(out: Path, prefix: str) -> dict[str, Any]:
    by = results_by_target(out)
    (name,) = [n for n in by if n.startswith(prefix)]
    return by[name]


def _blob(r: dict[str, Any]) -> str:
    return r["message"] + "\n" + "\n".join(f["message"] + "\n" + f["traceback"]
                                           for f in r["failures"])


@pytest.mark.slow
def test_a_patched_torch_function_fails_its_cell_not_the_next(trust_run) -> None:
    rc, output, out = trust_run
    assert rc == 1, output
    patcher = _result(out, "t00_")
    assert patcher["status"] == "failed", patcher
    assert patcher["failures"][0]["check"] == "process_state"
    assert "torch.testing.assert_close" in _blob(patcher)
    # The next cell's genuine mismatch is seen: assert_close was not left patched.
    victim = _result(out, "t01_")
    assert victim["status"] == "failed", victim
    assert "not close" in _blob(victim)


@pytest.mark.slow
def test_restorable_state_is_restored_between_cells(trust_run) -> None:
    _, _, out = trust_run
    assert _result(out, "t02_")["status"] == "passed"
    checker = _result(out, "t03_")
    assert checker["status"] == "passed", _blob(checker)
    ev = checker["evidence"]
    assert ev["default_dtype"] == "torch.float32" and ev["grad_enabled"] is True
    assert ev["counter"] == 0, "the case module was imported afresh"


@pytest.mark.slow
def test_a_cell_sees_the_same_state_alone_as_in_the_batch(trust_run, tmp_path: Path) -> None:
    _, _, out = trust_run
    batched = _result(out, "t03_")["evidence"]
    alone = run_cli("run", "--matrix", str(TRUST), "-k", "t03_state_fingerprint", "--no-cache",
                    "--plain", "--out", str(tmp_path / "alone"))
    assert alone.returncode == 0, alone.stdout + alone.stderr
    single = _result(tmp_path / "alone", "t03_")["evidence"]
    assert {k: v for k, v in single.items() if k != "case_file"} == \
        {k: v for k, v in batched.items() if k != "case_file"}


@pytest.mark.slow
def test_destroying_the_process_group_blames_the_case_that_did_it(trust_run) -> None:
    _, _, out = trust_run
    culprit = _result(out, "t04_")
    assert culprit["status"] == "failed", culprit
    assert culprit["failures"][0]["check"] == "process_shared"  # not reused, not recycled
    assert "process group" in _blob(culprit)
    innocent = _result(out, "t05_")
    assert innocent["status"] == "passed", _blob(innocent)


@pytest.mark.slow
def test_a_ranks_own_timed_out_message_is_its_error(trust_run) -> None:
    _, _, out = trust_run
    r = _result(out, "t06_")
    assert (r["status"], r["kind"], r["failing_ranks"]) == ("failed", "error", [1]), r
    assert r["attempts"] == 1, "an ordinary error is not retried as a crash"
    assert "Timed out waiting for the answer" in _blob(r)


@pytest.mark.slow
def test_a_very_long_cell_id_gets_a_short_folder(trust_run) -> None:
    _, _, out = trust_run
    long = _result(out, "t07_")
    assert long["status"] == "passed", _blob(long)
    assert _result(out, "t08_")["status"] == "passed"
    folder = out / long["out_dir"]
    assert folder.is_dir()
    assert all(len(part.encode()) <= 255 for part in folder.parts)


@pytest.mark.slow
def test_control_characters_never_stop_the_report(trust_run, tmp_path: Path) -> None:
    _, _, out = trust_run
    xml = JUnitXml.fromfile(str(out / "report.xml"))  # parses: the report was written
    cases = {c.name.split("[", 1)[0]: c for suite in xml for c in suite}
    assert len(cases) == 11
    text = "\n".join(r.text or "" for r in cases["t09_control_chars"].result)
    # Readable: colour codes gone, other unrepresentable characters spelled out.
    assert "bad value \\x00\\x0b here" in text, text[:2000]
    assert "red log line" in text
    gates = tmp_path / "gates.yaml"
    gates.write_text("version: 1\npolicies:\n  all: {}\n")
    gate = run_cli("gate", "--policy", "all", "--gates", str(gates),
                   "--report", str(out / "report.xml"))
    assert gate.returncode == 1, gate.stdout + gate.stderr  # read, and failed on the cells


@pytest.mark.slow
def test_infinite_evidence_is_written_as_valid_json(trust_run) -> None:
    _, _, out = trust_run

    def reject(name: str) -> None:
        raise ValueError(f"results.json holds the non-JSON constant {name}")

    results = json.loads((out / "results.json").read_text(), parse_constant=reject)
    (r,) = [r for r in results if r["cell_id"].startswith("t10_")]
    assert r["status"] == "passed"
    assert r["evidence"]["max_abs_diff"] == "inf" and r["evidence"]["min_value"] == "-inf"


@pytest.mark.slow
def test_every_case_module_that_ran_is_recorded(trust_run) -> None:
    _, _, out = trust_run
    r = _result(out, "t05_")
    assert r["evidence"]["case_file"] == str(RES / "cases" / "trust_cases.py")


# --------------------------------------------------------------------------- shadowing


def _shadow_project(root: Path, declared_passes: bool) -> Path:
    """``a/b/m.yaml`` (pythonpath ".") declaring ``cases:t``, with a decoy ``a/cases.py``."""
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "cases.py").write_text("def t(cell):\n    return None  # the decoy\n")
    body = "return None" if declared_passes else "raise AssertionError('declared module ran')"
    (root / "a" / "b" / "cases.py").write_text(f"def t(cell):\n    {body}\n")
    matrix = root / "a" / "b" / "m.yaml"
    matrix.write_text("version: 1\npythonpath: [.]\nplatforms:\n"
                      "  cpu: {backend: gloo, device: cpu}\n"
                      "targets:\n  - {name: t, case: 'cases:t', level: unit, "
                      "axes: {mesh: [1x2]}}\n")
    return matrix


@pytest.mark.slow
@pytest.mark.parametrize("declared_passes", [False, True])
def test_the_declared_case_module_runs_not_a_shadow(tmp_path: Path,
                                                    declared_passes: bool) -> None:
    matrix = _shadow_project(tmp_path, declared_passes)
    out = tmp_path / "out"
    proc = run_cli("run", "--matrix", str(matrix), "--no-cache", "--plain", "--out", str(out))
    assert proc.returncode == (0 if declared_passes else 1), proc.stdout + proc.stderr
    (r,) = results_by_target(out).values()
    if declared_passes:
        assert r["evidence"]["case_file"] == str(tmp_path / "a" / "b" / "cases.py")
    else:
        assert "declared module ran" in _blob(r)


# ------------------------------------------------------------------------------ cache


def _venv_with_probe(root: Path, version: int) -> str:
    """A venv seeing this interpreter's packages plus ``cpmatrix_probe`` at ``version``."""
    venv = root / f"venv{version}"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    pkg = root / f"probe{version}"
    (pkg / "cpmatrix_probe").mkdir(parents=True)
    (pkg / "cpmatrix_probe" / "__init__.py").write_text(f"VERSION = {version}\n")
    (pkg / "pyproject.toml").write_text(
        "[build-system]\nrequires = []\nbuild-backend = 'backend'\nbackend-path = ['.']\n"
        f"[project]\nname = 'cpmatrix-probe'\nversion = '{version}.0'\n")
    # A tiny in-tree PEP 517 backend: no network, no setuptools download.
    (pkg / "backend.py").write_text(_BACKEND)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", "--no-build-isolation", str(pkg)], check=True)
    return str(venv / "bin" / "python")


_BACKEND = '''
import base64, hashlib, os, zipfile

NAME, VERSION = "cpmatrix_probe", open("pyproject.toml").read().split("version = '")[1][:3]

def _record(z, files):
    lines = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        lines.append(f"{path},sha256={digest.decode()},{len(data)}")
        z.writestr(path, data)
    return lines

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist = f"cpmatrix_probe-{VERSION}.dist-info"
    name = f"cpmatrix_probe-{VERSION}-py3-none-any.whl"
    files = [("cpmatrix_probe/__init__.py", open("cpmatrix_probe/__init__.py", "rb").read()),
             (f"{dist}/METADATA",
              f"Metadata-Version: 2.1\\nName: cpmatrix-probe\\nVersion: {VERSION}\\n".encode()),
             (f"{dist}/WHEEL", b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\n"
                               b"Tag: py3-none-any\\n")]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        lines = _record(z, files)
        z.writestr(f"{dist}/RECORD", "\\n".join(lines + [f"{dist}/RECORD,,"]) + "\\n")
    return name
'''


@pytest.mark.slow
def test_the_cache_key_covers_the_interpreter_and_its_packages(tmp_path: Path) -> None:
    """A pass under one venv must not be reused under another where the cell fails."""
    py1 = _venv_with_probe(tmp_path, 1)
    py2 = _venv_with_probe(tmp_path, 2)
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "probe_case.py").write_text(
        "import cpmatrix_probe\n\ndef t(cell):\n"
        "    assert cpmatrix_probe.VERSION == 1, f'probe {cpmatrix_probe.VERSION}'\n")
    matrix = tmp_path / "m.yaml"
    matrix.write_text("version: 1\npythonpath: [cases]\nplatforms:\n"
                      "  cpu: {backend: gloo, device: cpu}\n"
                      "targets:\n  - {name: t, case: 'probe_case:t', level: unit}\n")
    cache = str(tmp_path / "cache")
    first = run_cli("run", "--matrix", str(matrix), "--python", py1, "--cache-dir", cache,
                    "--plain", "--out", str(tmp_path / "out1"))
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_cli("run", "--matrix", str(matrix), "--python", py1, "--cache-dir", cache,
                    "--plain", "--out", str(tmp_path / "out1"))
    assert "1 cached" in again.stdout, "the same interpreter reuses the pass"
    other = run_cli("run", "--matrix", str(matrix), "--python", py2, "--cache-dir", cache,
                    "--plain", "--out", str(tmp_path / "out2"))
    assert other.returncode == 1, other.stdout + other.stderr
    assert "cached" not in other.stdout.split("====")[-2]
    assert "probe 2" in other.stdout


# ---------------------------------------------------------------------- signals, --out


def _lines_done(log: Path, n: int) -> bool:
    return f"[{n}/" in log.read_text(errors="replace")


@pytest.mark.slow
def test_ctrl_c_keeps_finished_results_and_a_second_run_cannot_share_out(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start_cli("run", "--matrix", str(SIGNALS), "-k", "not s4_spawner", "--keep-order",
                     "--no-cache", "--plain", "--out", str(out), log=tmp_path / "log")
    try:
        wait_for("two finished cells", lambda: _lines_done(tmp_path / "log", 2))
        second = run_cli("run", "--matrix", str(SIGNALS), "-k", "s0_quick", "--no-cache",
                         "--plain", "--out", str(out))
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"pid {proc.pid}" in second.stderr, second.stderr
        t0 = time.monotonic()
        rc = stop(proc, signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "log").read_text()
    assert rc == 130, log
    assert time.monotonic() - t0 < 30, "the interrupted run stops promptly"
    by = results_by_target(out)
    assert by["s0_quick"]["status"] == by["s1_quick"]["status"] == "passed", log
    assert by["s2_sleeper"]["status"] == by["s3_quick"]["status"] == "interrupted", log
    cases = {c.name.split("[", 1)[0]: c for s in JUnitXml.fromfile(str(out / "report.xml"))
             for c in s}
    assert len(cases) == 4
    skipped = cases["s2_sleeper"].result[0]
    assert type(skipped).__name__ == "Skipped" and "interrupted" in skipped.message
    assert processes_with(f"cpmatrix.worker.world_main {out}") == []


@pytest.mark.slow
def test_sigterm_stops_every_process_the_run_started(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start_cli("run", "--matrix", str(SIGNALS), "-k", "s4_spawner", "--no-cache",
                     "--plain", "--out", str(out), log=tmp_path / "log")
    pid_files = [out / "cells" / "s4_spawner[unit,1x2,fp64,autocast=off,reference]@cpu" /
                 f"rank{r}" / "pids.json" for r in (0, 1)]
    try:
        wait_for("the children to start", lambda: all(p.exists() for p in pid_files))
        rc = stop(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "log").read_text()
    assert rc == 143, log
    started = []
    for p in pid_files:
        data = json.loads(p.read_text())
        started += [data["rank"], *data["children"]]
    assert len(started) == 8
    time.sleep(0.5)  # let init reap what was killed
    alive = [pid for pid in started if pid_alive(pid)]
    assert alive == [], f"processes outlived the run: {alive}"
    assert processes_with("cpmatrix-trust-orphan") == []
    assert results_by_target(out)["s4_spawner"]["status"] == "interrupted"


@pytest.mark.slow
def test_sigkill_of_cpmatrix_takes_torchrun_and_the_ranks_down(tmp_path: Path) -> None:
    """The one signal no handler sees: the parent-death signal must still end the world."""
    out = tmp_path / "out"
    proc = start_cli("run", "--matrix", str(SIGNALS), "-k", "s2_sleeper", "--no-cache",
                     "--plain", "--out", str(out), log=tmp_path / "log")
    world = out / "worlds"
    try:
        wait_for("the ranks to start", lambda: len(list(world.glob("*/rank*.pid"))) == 2)
        ranks = [json.loads(p.read_text())["pid"] for p in world.glob("*/rank*.pid")]
        torchrun = {parent_of(r) for r in ranks}
        proc.kill()
        proc.wait()
        wait_for("torchrun and the ranks to die",
                 lambda: not any(pid_alive(p) for p in [*ranks, *torchrun]), timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.docker
def test_sigkill_of_cpmatrix_ends_the_docker_world(tmp_path: Path) -> None:
    """Killing the ``docker run`` client leaves its container running: the watchdog inside
    (``cpmatrix.worker.watchdog``) must end it, ranks and all, when cpmatrix is gone."""
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode:
        pytest.skip("docker tests need a running engine")
    out = tmp_path / "out"
    proc = start_cli("run", "--matrix", str(SIGNALS), "-k", "s2_sleeper", "--no-cache",
                     "--plain", "--runner", "docker", "--out", str(out), log=tmp_path / "log")
    world = out / "worlds"
    prefix = f"cpmatrix-{proc.pid}-"

    def containers() -> list[str]:
        ps = subprocess.run(["docker", "ps", "--all", "--format", "{{.Names}}"],
                            capture_output=True, text=True, check=True)
        return [n for n in ps.stdout.split() if n.startswith(prefix)]

    try:
        wait_for("the ranks to start", lambda: len(list(world.glob("*/rank*.pid"))) == 2,
                 timeout=300)
        ranks = [json.loads(p.read_text())["pid"] for p in world.glob("*/rank*.pid")]
        assert containers(), "the world runs in a container of this run"
        proc.kill()
        proc.wait()
        wait_for("the container and its ranks to end",
                 lambda: not containers() and not any(pid_alive(p) for p in ranks),
                 timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        for name in containers():
            subprocess.run(["docker", "rm", "--force", name], capture_output=True, check=False)


def test_an_out_folder_holding_user_files_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    (out / "cells").mkdir(parents=True)
    (out / "cells" / "notes.txt").write_text("keep me")
    (out / "worlds").mkdir()
    proc = run_cli("run", "--matrix", str(SIGNALS), "-k", "s0_quick", "--out", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not a cpmatrix output folder" in proc.stderr
    assert (out / "cells" / "notes.txt").read_text() == "keep me"
    assert (out / "worlds").is_dir()


def test_an_interpreter_that_cannot_run_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_cli("run", "--matrix", str(SIGNALS), "-k", "s0_quick", "--python",
                   "/nonexistent/python", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--python /nonexistent/python" in proc.stderr


def test_internal_error_exits_4_and_still_writes_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cpmatrix import cli
    from cpmatrix.kinds.world import job as supervise

    out = tmp_path / "out"
    out.mkdir()
    (out / ".cpmatrix-out").write_text("")
    (out / "report.xml").write_text("<testsuites/>")  # an old report: must not survive

    def broken_poll(self: supervise.WorldRun) -> list[Any]:
        raise RuntimeError("planted internal bug")

    monkeypatch.setattr(supervise.WorldRun, "poll", broken_poll)
    rc = cli.main(["run", "--matrix", str(SIGNALS), "-k", "s0_quick", "--no-cache", "--plain",
                   "--out", str(out)])
    assert rc == 4
    cases = [c for s in JUnitXml.fromfile(str(out / "report.xml")) for c in s]
    assert [c.name.split("[")[0] for c in cases] == ["s0_quick"]
    (r,) = json.loads((out / "results.json").read_text())
    assert r["status"] == "crash" and "internal error" in r["message"]
    assert "planted internal bug" in r["message"]
    assert processes_with(f"cpmatrix.worker.world_main {out}") == []


def test_report_files_get_the_users_normal_mode(tmp_path: Path) -> None:
    from cpmatrix.fsutil import atomic_write_json

    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "r.json", {"x": float("inf")})
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644
    assert json.loads((tmp_path / "r.json").read_text()) == {"x": "inf"}
