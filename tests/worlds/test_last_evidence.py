"""The last evidence survives (issue 30): a run that selects nothing (exit 3), fails to
load (exit 2) or is stopped (SIGINT, SIGTERM, SIGKILL) never leaves less evidence in
``--out`` than there was. One red run (tests/resources/flaky.yaml: its ``broken`` cell
fails) is the evidence; each later run into the same folder must keep it, in place or in
``previous/``, and ``show``, ``repro --failed`` and ``gate`` must still find it."""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import pytest

from cli_runner import RES, run_cli, start_cli, stop, wait_for

pytestmark = pytest.mark.slow

FLAKY = RES / "flaky.yaml"
SIGNALS = RES / "signals.yaml"
GATES = RES.parent.parent / "matrix" / "gates.yaml"
BROKEN = "broken[unit,1x1,fp64,autocast=off,reference]@cpu"
#: What a run leaves that must survive (durations.json stays in place, always).
EVIDENCE = ("report.xml", "report.html", "results.json", "run.json", "cells", "worlds")


def snapshot(folder: Path, names: tuple[str, ...] = (*EVIDENCE, "durations.json"),
             ) -> dict[str, str]:
    """Every file under ``names`` in ``folder``, by path, as a hash of its bytes."""
    out = {}
    for name in names:
        top = folder / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            out[str(f.relative_to(folder))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def red(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A red run's folder and the snapshot of its evidence."""
    out = tmp_path_factory.mktemp("evidence") / "out"
    first = run_cli("run", "--matrix", str(FLAKY), "--no-cache", "--plain", "--runner",
                    "local", "--out", str(out))
    assert first.returncode == 1, first.stdout + first.stderr
    before = snapshot(out)
    assert {"report.xml", "report.html", "results.json", "durations.json"} <= set(before)
    assert any(k.startswith("cells/") for k in before)
    assert any(k.startswith("worlds/") for k in before)
    return out, before


def test_a_run_that_selects_nothing_or_fails_to_load_keeps_the_evidence(
        red: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    out, before = red
    typo = run_cli("run", "--matrix", str(FLAKY), "-k", "brokne", "--plain", "--out", str(out))
    assert typo.returncode == 3, typo.stdout + typo.stderr
    assert snapshot(out) == before
    missing = run_cli("run", "--matrix", str(tmp_path / "typo.yaml"), "--plain",
                      "--out", str(out))
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert snapshot(out) == before
    assert not (out / "previous").exists()  # nothing ran: nothing moved either
    # ... and the tools that read the last run still find it.
    show = run_cli("show", BROKEN, "--matrix", str(FLAKY), "--out", str(out))
    assert show.returncode == 0, show.stdout + show.stderr
    assert "broken on every run" in show.stdout
    gate = run_cli("gate", "--policy", "release", "--gates", str(GATES),
                   "--report", str(out / "report.xml"))
    assert gate.returncode == 1, gate.stdout + gate.stderr  # judged, not "no such report"
    assert "broken" in gate.stdout
    repro = run_cli("repro", "--failed", "--from", str(out), "--matrix", str(FLAKY),
                    "--runner", "local")
    assert repro.returncode == 1, repro.stdout + repro.stderr
    assert "broken" in repro.stdout + repro.stderr
    assert snapshot(out) == before  # repro writes under out/repro, never the evidence


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["sigint", "sigterm", "sigkill"])
def test_a_stopped_run_keeps_the_last_evidence_in_previous(
        red: tuple[Path, dict[str, str]], tmp_path: Path, sig: signal.Signals) -> None:
    src, _ = red
    out = tmp_path / "out"  # a copy of the red folder for each signal
    _copy(src, out)
    before = snapshot(out)
    proc = start_cli("run", "--matrix", str(SIGNALS), "-k", "s2_sleeper", "--no-cache",
                     "--plain", "--runner", "local", "--out", str(out), log=tmp_path / "log")
    try:
        # (the copied red run has rank pid files too: wait for this run's, after the move)
        wait_for("the ranks to start", lambda: (out / "previous").is_dir() and len(
            list((out / "worlds").glob("*/rank*.pid"))) == 2)
        if sig is signal.SIGKILL:
            proc.kill()
            rc = proc.wait()
        else:
            rc = stop(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "log").read_text()
    assert rc == {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -9}[sig], log
    assert snapshot(out / "previous", EVIDENCE) == {
        k: v for k, v in before.items() if not k.startswith("durations")}, log
    if sig is not signal.SIGKILL:  # the stopped run's own report, beside previous/
        assert "interrupted" in (out / "results.json").read_text()
        return
    # Killed outright: no report of its own. The next run with cells drops its leftovers
    # and keeps previous/ (a report is never traded for leftovers).
    assert not (out / "report.xml").exists()
    again = run_cli("run", "--matrix", str(SIGNALS), "-k", "s0_quick", "--no-cache",
                    "--plain", "--runner", "local", "--out", str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    assert snapshot(out / "previous", EVIDENCE) == {
        k: v for k, v in before.items() if not k.startswith("durations")}


def _copy(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".cpmatrix.lock", "repro"))
