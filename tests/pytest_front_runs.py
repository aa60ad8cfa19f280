"""Helpers of the pytest front's world tests: run pytest (natively, under torchrun, or with
``--cpmatrix``) on the suites in ``tests/resources/pytest_front_suites`` and read each
test's outcome from the JUnit XML pytest writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

SUITES = Path(__file__).resolve().parent / "resources" / "pytest_front_suites"

#: What a ``<testcase>`` of pytest's JUnit XML says, per child element.
_OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}


@dataclass
class Run:
    rc: int
    output: str
    #: "classname::name" (JUnit's) -> passed, failed, error, skipped, xfailed (an xpass
    #: reads as passed).
    outcomes: dict[str, str]
    #: the same key -> the text of its failure, error or skipped elements.
    texts: dict[str, str]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONDONTWRITEBYTECODE"] = "1"  # the suites are test data: no __pycache__ there
    e.pop("PYTEST_ADDOPTS", None)
    return e


def read_junit(*paths: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Outcomes merged over several reports (torchrun's ranks): a failure anywhere wins."""
    outcomes: dict[str, str] = {}
    texts: dict[str, str] = {}
    rank = {"error": 0, "failed": 1, "skipped": 2, "xfailed": 3, "passed": 4}
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            # JUnit's classname.name: "dialects.test_x.TestC::test_y[2]"
            nodeid = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome, text = "passed", ""
            for child in case:
                if child.tag in _OUTCOMES:
                    outcome = _OUTCOMES[child.tag]
                    if child.tag == "skipped" and child.get("type") == "pytest.xfail":
                        outcome = "xfailed"
                    text += (child.get("message") or "") + "\n" + (child.text or "")
                    if child.tag in ("failure", "error"):
                        break
            if nodeid not in outcomes or rank[outcome] < rank[outcomes[nodeid]]:
                outcomes[nodeid] = outcome
            texts[nodeid] = texts.get(nodeid, "") + text
    return outcomes, texts


def _run(argv: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """Run in a session of its own; on timeout the whole tree is killed (a native run's
    spawned ranks too), then the timeout is raised."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out


def pytest_run(args: list[str], junit: Path, *, timeout: float = 900,
               cwd: Path = SUITES) -> Run:
    """``python -m pytest ARGS --junitxml JUNIT`` in the suites' folder."""
    rc, out = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", *args], cwd, timeout)
    outcomes, texts = read_junit(junit) if junit.exists() else ({}, {})
    return Run(rc, out, outcomes, texts)


def torchrun_run(nproc: int, args: list[str], out: Path, *, timeout: float = 900) -> Run:
    """Each rank a pytest process under torchrun (the native run of ``world``-marked
    tests); a test's outcome merges every rank's (a failure on any rank fails it)."""
    out.mkdir(parents=True, exist_ok=True)
    wrapper = out / "rank_pytest.py"
    wrapper.write_text(
        "import os, sys, pytest\n"
        f"sys.exit(pytest.main(sys.argv[1:] + ['--junitxml={out}/rank' "
        "+ os.environ['RANK'] + '.xml']))\n")
    rc, output = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc-per-node={nproc}", str(wrapper), "-p", "no:cacheprovider",
                       *args], SUITES, timeout)
    junits = sorted(out.glob("rank*.xml"))
    outcomes, texts = read_junit(*junits) if junits else ({}, {})
    return Run(rc, output, outcomes, texts)
