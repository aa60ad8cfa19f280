"""Every benchmark in ``benchmarks/`` runs: each at its smallest size (``--smoke``) in a
subprocess, as ``python benchmarks/NAME.py`` is run by hand; a new benchmark is covered
by being there. Helpers of the benchmarks start with ``_`` (``_bench.py``, a rank script)
and run only through them.

Static checks keep the benchmarks on the public surface, so that a change inside the run
breaks a test here, never a benchmark silently: the CLI (through ``_bench.cpmatrix``) and
the readers of what a run writes (``report.xml``), never ``cpmatrix.supervise`` or ``cpmatrix.cli``
internals nor a world's own files.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
#: Seconds of a smoke run on an idle 2-core machine: the ones that start worlds or
#: torch's own harness are ``slow``.
FAST = {"expand.py"}
#: What only a world's internals name (worker/protocol.py's files and folders).
WORLD_FILES = ("worlds", "progress", "world.json", ".done", ".start", ".left", ".pid")


def _source(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 8, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_has_a_smoke_size(script: Path) -> None:
    tree = _source(script)
    calls = {node.func.id for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "add_smoke" in calls, f"{script.name}: give it --smoke (_bench.add_smoke)"
    read = any(isinstance(node, ast.Attribute) and node.attr == "smoke" for node in ast.walk(tree))
    assert read, f"{script.name}: --smoke is parsed but never read (args.smoke)"


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_use_the_cli_and_public_readers(script: Path) -> None:
    for node in ast.walk(_source(script)):
        if isinstance(node, ast.ImportFrom) and node.module:
            # ``from cpmatrix import supervise`` names cpmatrix.supervise as well.
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = []
        for name in names:
            assert not name.startswith(("cpmatrix.supervise", "cpmatrix.cli")), (
                f"{script.name} imports {name}: run cpmatrix through _bench.cpmatrix and read "
                "its report (cpmatrix.report.read_report)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            assert value not in WORLD_FILES[:3] and not value.endswith(WORLD_FILES[3:]), (
                f"{script.name} names a world's own file ({value!r}): read the report")


@pytest.mark.parametrize("script", [
    pytest.param(p, marks=() if p.name in FAST else pytest.mark.slow) for p in SCRIPTS
], ids=lambda p: p.name)
def test_every_benchmark_runs_at_its_smallest_size(script: Path, tmp_path: Path) -> None:
    # As on a CI machine, which sets ``CI``: torch's own harness reads it (run_tests then
    # writes XML through xmlrunner, which nothing here installs), so a benchmark must
    # run the same whether it is set or not.
    env = dict(os.environ, CI="true")
    proc = subprocess.run([sys.executable, str(script), "--smoke"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (
        f"python benchmarks/{script.name} --smoke: exit {proc.returncode}\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    assert proc.stdout.strip(), "a benchmark prints its numbers"


def test_the_continuous_peer_holds_the_tests_it_is_timed_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``peers.py`` times ``MultiProcContinuousTest`` on as many tests per mesh as its own
    cells: unittest's loader must find exactly ``REPS`` tests in each mesh's class and no
    class twice (a module-level name bound to a class is one more TestCase to it: the 3x3
    world ran twice, 45 tests for 30 cells). The smoke run keeps 2x2 only and cannot see it."""
    import importlib.util
    import unittest

    monkeypatch.setenv("CPMATRIX_PEER_REPS", "3")
    monkeypatch.delenv("CPMATRIX_PEER_MESHES", raising=False)
    monkeypatch.syspath_prepend(str(BENCHMARKS / "cases"))
    spec = importlib.util.spec_from_file_location("_peers_continuous_probe",
                                                  BENCHMARKS / "_peers_continuous.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    suite = unittest.TestLoader().loadTestsFromModule(module)
    found: dict[str, int] = {}
    for case in _cases(suite):
        name = type(case).__name__
        found[name] = found.get(name, 0) + 1
    assert found == {"Mesh2x2": 3, "Mesh3x3": 3}


def _cases(suite: object) -> list[object]:
    import unittest

    if isinstance(suite, unittest.TestSuite):
        return [c for s in suite for c in _cases(s)]
    return [suite]
