"""examples/ci/: the GitHub Actions and GitLab CI templates parse, have the promised shape
(N shard jobs, then one merge + gate job with the last release's report as baseline), and
their cpmatrix commands, run as written by bash with the variables CI would set, shard,
merge and gate a real run.

The matrix the templates name (the release matrix, cuda) is swapped for the small CPU one
through the templates' own variables (MATRIX, PLATFORM, POLICY, GATES), and N for 2: the
commands are the templates' text, unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cli_runner import RES
from cpmatrix.report import read_report

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"
SMALL = {"MATRIX": str(RES / "runtime.yaml"), "PLATFORM": "cpu", "POLICY": "runtime",
         "GATES": str(RES / "gates" / "policies.yaml")}
N = 2


def _cpmatrix_lines(script: str | list[str]) -> list[str]:
    lines = script if isinstance(script, list) else script.splitlines()
    return [ln.strip() for ln in lines if ln.strip().startswith("cpmatrix ")]


def _bash(line: str, cwd: Path, env: Mapping[str, str], shim: Path) -> int:
    """One template line under ``bash -e`` (as both CIs run scripts); ``cpmatrix`` is this
    checkout's (a shim first on PATH)."""
    full = {**os.environ, **env, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-ec", line], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode in (0, 1), (line, proc.stdout, proc.stderr)
    return proc.returncode


def _shim(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "cpmatrix"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cpmatrix "$@"\n')
    exe.chmod(0o755)
    return bin_dir


def _check_merged(merged: Path) -> None:
    cells = read_report(merged / "report.xml")
    assert len(cells) == 4 and all(c.status.ok for c in cells), cells


def test_github_actions_template(tmp_path: Path) -> None:
    wf: dict[Any, Any] = yaml.safe_load((CI / "github-actions.yml").read_text())
    env = {k: str(v) for k, v in wf["env"].items()}
    shard, gate = wf["jobs"]["shard"], wf["jobs"]["merge-and-gate"]
    assert shard["strategy"]["matrix"]["shard"] == list(range(1, 9))
    assert shard["strategy"]["fail-fast"] is False
    assert gate["needs"] == "shard" and gate["if"] == "always()"
    shard_lines = [ln for s in shard["steps"] for ln in _cpmatrix_lines(s.get("run", ""))]
    gate_lines = [ln for s in gate["steps"] for ln in _cpmatrix_lines(s.get("run", ""))]
    assert [ln.split()[1] for ln in shard_lines] == ["run"]
    assert [ln.split()[1] for ln in gate_lines] == ["merge", "gate"]
    assert "--baseline baseline/report.xml" in gate_lines[1]
    uploads = [s for s in shard["steps"] if str(s.get("uses", "")).startswith(
        "actions/upload-artifact")]
    assert uploads[0]["with"]["path"] == "out/shard"

    shim = _shim(tmp_path)
    merge_dir = tmp_path / "merge-job"
    for k in range(1, N + 1):
        job = tmp_path / f"shard-job-{k}"
        (job / "baseline").mkdir(parents=True)
        (job / "baseline" / "durations.json").write_text("{}")  # the first release
        _bash(shard_lines[0], job, {**env, **SMALL, "SHARD": str(k), "SHARDS": str(N)}, shim)
        # upload-artifact name shard-K, download-artifact pattern shard-* into shards/
        shutil.copytree(job / "out" / "shard", merge_dir / "shards" / f"shard-{k}")
    assert _bash(gate_lines[0], merge_dir, {**env, **SMALL}, shim) == 0
    _check_merged(merge_dir / "out" / "merged")
    # The "last release" is this merged report (kept for the GitLab test's baseline).
    shutil.copytree(merge_dir / "out" / "merged", merge_dir / "baseline")
    assert _bash(gate_lines[1], merge_dir, {**env, **SMALL}, shim) == 0


def test_gitlab_ci_template(tmp_path: Path) -> None:
    ci: dict[Any, Any] = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
    env = {k: str(v) for k, v in ci["variables"].items()}
    shard, gate = ci["shard"], ci["merge-and-gate"]
    assert ci["stages"] == ["shard", "gate"]
    assert (shard["stage"], shard["parallel"], gate["stage"]) == ("shard", 8, "gate")
    assert gate["when"] == "always"
    assert any("baseline/report.xml" not in ln and "report.xml" in ln
               for ln in shard["before_script"]), "the baseline is fetched"
    shard_lines = _cpmatrix_lines(shard["script"])
    gate_lines = _cpmatrix_lines(gate["script"])
    assert [ln.split()[1] for ln in shard_lines] == ["run"]
    assert [ln.split()[1] for ln in gate_lines] == ["merge", "gate"]
    assert "--baseline baseline/report.xml" in gate_lines[1]

    shim = _shim(tmp_path)
    # The last release: one unsharded run of the same selection (its durations and report).
    last = tmp_path / "last"
    _bash(f'cpmatrix run --matrix "$MATRIX" --platform "$PLATFORM" --out {last} --no-cache',
          tmp_path, SMALL, shim)
    work = tmp_path / "work"  # GitLab hands every job's artifacts to the next stage as is
    (work / "baseline").mkdir(parents=True)
    for name in ("report.xml", "durations.json"):
        shutil.copy(last / name, work / "baseline" / name)
    for k in range(1, N + 1):
        _bash(shard_lines[0], work,
              {**env, **SMALL, "CI_NODE_INDEX": str(k), "CI_NODE_TOTAL": str(N)}, shim)
    manifests = [json.loads((work / "shards" / f"shard-{k}" / "shard.json").read_text())
                 for k in range(1, N + 1)]
    assert all(m["of"] == N for m in manifests)
    assert _bash(gate_lines[0], work, {**env, **SMALL}, shim) == 0
    _check_merged(work / "out" / "merged")
    assert _bash(gate_lines[1], work, {**env, **SMALL}, shim) == 0
