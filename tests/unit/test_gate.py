"""The release gate: each check fails on the report made to fail it and passes otherwise.

The reports in ``resources/reports/`` are ``green.xml`` (passes every check) and one file
per defect (see ``make_synthetic.py``), plus ``runtime.xml`` and ``faults.xml``, written by
real ``cpmatrix run``s of ``resources/runtime.yaml`` and ``resources/faults.yaml``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpmatrix.errors import SpecError
from cpmatrix.gate import (
    Policy,
    evaluate,
    expected_cells,
    gate_main,
    load_policies,
)
from cpmatrix.gate._checks import check_drift, check_spill
from cpmatrix.report import ReportCell, ReportError, read_report
from cpmatrix.result import Status

RES = Path(__file__).parents[1] / "resources"
REPORTS = RES / "reports"
POLICIES = RES / "gates" / "policies.yaml"
DEFAULT_GATES = Path(__file__).parents[2] / "matrix" / "gates.yaml"

R11 = "ring[unit,1x1,fp64,autocast=off,reference]@cpu"
R12 = "ring[unit,1x2,fp64,autocast=off,reference]@cpu"
R22 = "ring[unit,2x2,bf16,autocast=on,reference,seq=7]@cpu"
SPILL = "softmax_spill[unit,1x1,fp32,autocast=off,kernel,block=1024]@cpu"


def reasons(policy: str, report: str, baseline: str | None = None) -> list[tuple[str, str]]:
    """``(check, cell)`` of every reason the policy gives for the report (via the files)."""
    chosen = load_policies(POLICIES)[policy]
    expected = [cid for cid, _, _ in expected_cells(chosen)] if chosen.matrices else None
    old = read_report(REPORTS / baseline) if baseline else None
    result = evaluate(chosen, read_report(REPORTS / report), old, expected)
    return [(r.check, r.cell) for r in result.reasons]


@pytest.mark.parametrize(
    ("policy", "report", "baseline", "expected"),
    [
        # cached counts as passed; the failed untagged cell and the cuda cell are out of scope.
        ("strict", "green.xml", None, []),
        ("strict", "green.xml", "green.xml", []),
        ("strict", "failed.xml", None, [("status", R11)]),
        ("loose", "failed.xml", None, [("status", R11)]),  # nothing allows a failure
        ("strict", "skipped.xml", None, [("skipped", R12)]),
        ("loose", "skipped.xml", None, []),
        ("strict", "flaky.xml", None, [("flaky", R11)]),
        ("loose", "flaky.xml", None, []),
        ("strict", "missing.xml", "green.xml", [("missing", R22)]),
        # No matrix and no baseline: nothing says the cell should be there (the output says so).
        ("strict", "missing.xml", None, []),
        ("strict", "spill.xml", None, [("spill", SPILL)]),
        ("loose", "spill.xml", None, [("spill", SPILL)]),
        ("strict", "survivor.xml", None,
         [("mutants", "(2 mutant runs)"), ("mutants", f"{R12}!mutant=skip_shard")]),
        ("loose", "survivor.xml", None, []),  # min_kill_rate 0.5, and 1 of 2 was killed
        # R11 grew x5 (flagged although it passes); R12 0 -> 1e-16 is under the floor and
        # R22 grew x1.33: neither is drift.
        ("strict", "drift.xml", "green.xml", [("drift", R11)]),
        ("strict", "drift.xml", None, []),
        ("strict", "green.xml", "drift.xml", []),  # errors that shrank are not drift
        ("loose", "drift.xml", "green.xml", []),  # drift_factor 10
        ("ring-only", "drift.xml", "green.xml", []),  # drift_keys: only *.max_rel
        # keyword "ring and not bf16": the spill cell and R22 are not required there.
        ("ring-only", "spill.xml", None, []),
        ("ring-only", "missing.xml", "green.xml", []),
        ("nothing", "green.xml", None, [("empty", "-")]),
    ],
)
def test_each_check_fails_on_its_defect_only(
    policy: str, report: str, baseline: str | None, expected: list[tuple[str, str]]
) -> None:
    assert reasons(policy, report, baseline) == expected


def test_required_cells_come_from_the_policys_matrix() -> None:
    # Both reports are from real runs; faults.yaml's cells are not the runtime matrix's.
    assert reasons("runtime", "runtime.xml") == []
    allreduce = [f"allreduce[unit,{m},fp64,autocast=off,reference]@cpu"
                 for m in ("1x1", "1x2", "2x2")]
    assert reasons("runtime", "faults.xml") == [("missing", cid) for cid in allreduce]


def test_a_real_run_with_planted_faults_fails_with_one_row_per_bad_cell(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # faults.xml: `cpmatrix run -k "fault=raise_all or fault=exit13"` over faults.yaml; the
    # cases raise on every rank (raise_all) or kill rank 1 (exit13) at pos 0, 3 and 6.
    code = gate_main("everything", REPORTS / "faults.xml", None, POLICIES)
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[0].split() == ["CHECK", "CELL", "DETAIL"]
    rows = [ln.split(None, 2) for ln in out[1:-1]]
    bad = {f"seq[unit,1x2,fp64,autocast=off,reference,fault={f},pos={p}]@cpu": f
           for f in ("raise_all", "exit13") for p in (0, 3, 6)}
    assert sorted(r[1] for r in rows) == sorted(bad)
    for check, cell, detail in rows:
        assert check == "status"
        if bad[cell] == "raise_all":
            assert detail == "failed (error) on rank 0,1: RuntimeError: planted failure on rank 0"
        else:
            assert detail.startswith("crash (crash) on rank 1: rank 1 died")
            assert "exited with code 13" in detail
    assert out[-1] == "FAIL  gate 'everything': 6 reasons (6 status) over 14 required cells"


def test_pass_output_names_what_was_and_was_not_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert gate_main("loose", REPORTS / "skipped.xml", None, POLICIES) == 0
    assert capsys.readouterr().out.splitlines() == [
        "required  4 cells (3 passed, 1 skipped); presence not checked "
        "(no matrix in the policy, no baseline)",
        "sources   not checked (no matrix: give --matrix or a matrix: in the policy)",
        "mutants   2/2 killed",
        "drift     not checked (no baseline)",
        "PASS  gate 'loose': every check passed over 4 required cells",
    ]
    assert gate_main("strict", REPORTS / "green.xml", REPORTS / "green.xml", POLICIES) == 0
    out = capsys.readouterr().out
    assert "(3 passed, 1 cached); none missing from the baseline" in out
    assert "drift     within x2 of the baseline for 3 cells" in out


def test_fail_output_gives_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert gate_main("strict", REPORTS / "drift.xml", REPORTS / "green.xml", POLICIES) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].split(None, 2) == ["drift", R11, "parity.max_abs 1e-09 -> 5e-09 (x5 > x2)"]
    assert gate_main("strict", REPORTS / "spill.xml", None, POLICIES) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].split(None, 2)[2] == (
        "spill stores 7420 B, loads 9508 B > budget 0 B (255 registers)")


def _cell(name: str, **evidence: str) -> ReportCell:
    props = {f"evidence.{k.replace('__', '@')}": v for k, v in evidence.items()}
    return ReportCell(name=name, status=Status.PASSED, properties=props)


@pytest.mark.parametrize(
    ("old", "new", "flagged"),
    [
        ({"max_abs_diff": "1e-8"}, {"max_abs_diff": "2e-8"}, False),  # exactly x2: allowed
        ({"max_abs_diff": "1e-8"}, {"max_abs_diff": "2.1e-8"}, True),
        ({"max_abs_diff": "0.0"}, {"max_abs_diff": "1e-13"}, False),  # under the floor
        ({"max_abs_diff": "0.0"}, {"max_abs_diff": "1e-6"}, True),  # 0 -> real error
        ({"max_abs_diff": "1e-8"}, {"max_abs_diff": "nan"}, True),
        ({"max_abs_diff": "nan"}, {"max_abs_diff": "1.0"}, False),  # no number to compare to
        # Ranks disagreed: the worst rank counts, on either side.
        ({"max_abs_diff": "1e-8"}, {"max_abs_diff": "1e-8", "max_abs_diff__rank1": "5e-8"},
         True),
        ({"max_abs_diff": "1e-8", "max_abs_diff__rank1": "4e-8"}, {"max_abs_diff": "5e-8"},
         False),
        ({"other.max_rel": "1e-8"}, {"other.max_rel": "1e-6"}, True),  # *.max_rel pattern
        ({"max_abs_diff": "1e-8"}, {"max_rel_diff": "1.0"}, False),  # a new key: no baseline
        ({"note.max_abs": "n/a"}, {"note.max_abs": "text"}, False),  # text, not a number
    ],
)
def test_drift_rules(old: dict[str, str], new: dict[str, str], flagged: bool) -> None:
    policy = Policy(name="p", drift_factor=2.0, drift_floor=1e-12)
    found, _ = check_drift(policy, [_cell("c", **new)], {"c": _cell("c", **old)})
    assert [r.check for r in found] == (["drift"] if flagged else []), found


@pytest.mark.parametrize(
    ("evidence", "flagged"),
    [
        ({"spill_store_bytes": "0", "spill_load_bytes": "0", "budget_bytes": "0"}, False),
        ({"spill_store_bytes": "0", "spill_load_bytes": "64", "budget_bytes": "0"}, True),
        ({"spill_store_bytes": "64", "spill_load_bytes": "0", "budget_bytes": "0"}, True),
        ({"spill_store_bytes": "4096", "spill_load_bytes": "8192", "budget_bytes": "8192"},
         False),
        ({"spill_store_bytes": "4096", "spill_load_bytes": "8193", "budget_bytes": "8192"},
         True),
        ({"spill_store_bytes": "16"}, True),  # no budget recorded: the default budget is 0
        ({"spill_store_bytes": "many", "budget_bytes": "0"}, True),  # unreadable: not within
        ({"registers": "255"}, False),  # not a spill cell
    ],
)
def test_spill_rules(evidence: dict[str, str], flagged: bool) -> None:
    found = check_spill([_cell(SPILL, **evidence)])
    assert [r.check for r in found] == (["spill"] if flagged else []), found


def test_default_policies() -> None:
    policies = load_policies(DEFAULT_GATES)
    release, nightly = policies["release"], policies["nightly"]
    assert release.tags == ("release",) and nightly.tags == ("release",)
    assert (release.allow_flaky, release.min_kill_rate, release.drift_factor) == (False, 1.0, 2.0)
    assert not release.allow_skipped
    assert nightly.allow_flaky
    flaky = read_report(REPORTS / "flaky.xml")
    assert [r.check for r in evaluate(release, flaky).reasons] == ["flaky"]
    assert evaluate(nightly, flaky).ok
    # Both name the matrix whose release cells must all be present.
    assert release.matrices == (DEFAULT_GATES.parent / "parity.yaml",)


GOOD = "version: 1\npolicies:\n  p:\n    tags: [release]\n"


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("version: 1\npolicies:\n  p: {tags: [release], drift_facter: 2}\n",
         ":3:", "policies.p.drift_facter: unknown key 'drift_facter' (allowed: description,"),
        ("version: 1\npolices:\n  p: {}\n", ":2:", "polices: unknown key 'polices'"),
        ("policies:\n  p: {}\n", "", "version: must be 1, got None"),
        ("version: 2\npolicies:\n  p: {}\n", ":1:", "version: must be 1, got 2"),
        ("version: 1\npolicies: []\n", ":2:", "policies: must map policy names"),
        ("version: 1\npolicies:\n  p: [release]\n", ":3:", "policies.p: must be a mapping"),
        ("version: 1\npolicies:\n  p: {tags: release}\n", ":3:",
         "policies.p.tags: must be a list of strings, got 'release'"),
        ("version: 1\npolicies:\n  p: {tags: [release, 3]}\n", ":3:",
         "policies.p.tags[1]: must be a non-empty string, got 3"),
        ("version: 1\npolicies:\n  p:\n    drift_factor: 0.5\n", ":4:",
         "policies.p.drift_factor: must be a number in [1, inf], got 0.5"),
        ("version: 1\npolicies:\n  p:\n    min_kill_rate: 100\n", ":4:",
         "policies.p.min_kill_rate: must be a number in [0, 1], got 100"),
        ("version: 1\npolicies:\n  p:\n    min_kill_rate: true\n", ":4:", "got True"),
        ("version: 1\npolicies:\n  p:\n    allow_flaky: sometimes\n", ":4:",
         "policies.p.allow_flaky: must be true or false, got 'sometimes'"),
        ("version: 1\npolicies:\n  p:\n    keyword: 'ring and'\n", ":4:",
         "policies.p.keyword: -k 'ring and': expected a word or '(' at column 9"),
        ("version: 1\npolicies:\n  p: {tags: [a}\n", ":3:15:", "YAML syntax error: expected"),
        ("version: 1\npolicies:\n  'bad name': {}\n", "", "policy name 'bad name' must be"),
    ],
)
def test_malformed_policies_name_file_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, message: str
) -> None:
    gates = tmp_path / "gates.yaml"
    gates.write_text(text)
    with pytest.raises(SpecError) as info:
        load_policies(gates)
    assert str(info.value).startswith(f"{gates}{where}"), str(info.value)
    assert message in str(info.value)
    # Through the command: exit 2, one line, no traceback.
    assert gate_main("p", REPORTS / "green.xml", None, gates) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("policy", "report", "baseline", "gates", "message"),
    [
        ("nope", "green.xml", None, POLICIES,
         "no policy 'nope' (allowed: strict, loose, ring-only, runtime, nothing, everything)"),
        ("strict", "absent.xml", None, POLICIES, "absent.xml: no such report"),
        ("strict", "green.xml", "absent.xml", POLICIES, "absent.xml: no such report"),
        ("strict", "not_junit.xml", None, POLICIES, "not_junit.xml: not a JUnit XML report"),
        ("strict", "truncated.xml", None, POLICIES, "truncated.xml: not a JUnit XML report"),
        ("strict", "bad_status.xml", None, POLICIES, "unknown status 'exploded' (allowed: passed,"),
        ("strict", "duplicate.xml", None, POLICIES,
         f"testcase '{R11}' appears twice"),
        ("strict", "green.xml", None, RES / "gates" / "absent.yaml", "no such gates file"),
    ],
)
def test_malformed_inputs_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], policy: str, report: str, baseline: str | None,
    gates: Path, message: str,
) -> None:
    code = gate_main(policy, REPORTS / report, REPORTS / baseline if baseline else None, gates)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("cpmatrix gate: error: ") and err.count("\n") == 1
    assert message in err, err


def test_a_policy_pointing_at_a_missing_matrix_is_malformed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gates = tmp_path / "gates.yaml"
    gates.write_text("version: 1\npolicies:\n  p: {matrix: [gone.yaml]}\n")
    assert gate_main("p", REPORTS / "green.xml", None, gates) == 2
    err = capsys.readouterr().err
    assert f"{gates}: policies.p.matrix: {tmp_path / 'gone.yaml'}: no such matrix file" in err


def test_plain_junit_from_another_tool_is_read_from_its_elements() -> None:
    cells = read_report(REPORTS / "plain_junit.xml")
    assert [(c.status, c.platform, c.axis("mesh")) for c in cells] == [
        (Status.PASSED, "cpu", "1x1"), (Status.FAILED, "cpu", "1x2"),
        (Status.SKIPPED, "cpu", "2x2")]
    assert cells[1].text == "trace" and cells[2].headline == "no GPU"


def test_report_error_is_one_line() -> None:
    with pytest.raises(ReportError) as info:
        read_report(REPORTS / "truncated.xml")
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_gate_over_a_live_run(tmp_path: Path) -> None:
    """A real `cpmatrix run` of runtime.yaml passes the runtime policy, also against the
    stored report of an earlier run as the baseline (its errors are exactly 0.0)."""
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "cpmatrix", "run", "--matrix", str(RES / "runtime.yaml"),
         "--out", str(out), "--plain"],
        capture_output=True, text=True, timeout=600, check=False, env=dict(os.environ))
    assert run.returncode == 0, run.stdout + run.stderr
    report = out / "report.xml"
    assert gate_main("runtime", report, REPORTS / "runtime.xml", POLICIES) == 0
    chosen = load_policies(POLICIES)["runtime"]
    result = evaluate(chosen, read_report(report), read_report(REPORTS / "runtime.xml"),
                      [cid for cid, _, _ in expected_cells(chosen)])
    assert result.required == 3 and result.drift_compared == 3 and result.ok


# --------------------------------------------------------------------------------------
# sources: a cell run from other sources is stale (issue 21, row 7)


def _sourced_report(tmp_path: Path, edit: dict[str, str]) -> Path:
    """A report of every cell of runtime.yaml, passed, each carrying the source digest
    its matrix gives it now (``edit``: cell id -> another digest)."""
    from cpmatrix.cache.provenance import matrix_digests
    from cpmatrix.matrix.expand import expand
    from cpmatrix.matrix.load import load_matrix
    from cpmatrix.report.junit import results_to_junit, write_junit
    from cpmatrix.result import Result

    digests = matrix_digests(RES / "runtime.yaml")
    cells = {c.id: c for c in expand(load_matrix(RES / "runtime.yaml")).cells}
    results = [Result(cell_id=c, status=Status.PASSED,
                      source={"digest": edit.get(c, d), "matrix": "m"})
               for c, d in sorted(digests.items())]
    path = tmp_path / "report.xml"
    write_junit(path, results_to_junit(results, cells))
    return path


def test_a_report_from_todays_sources_passes_and_says_it_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate_main("runtime", _sourced_report(tmp_path, {}), None, POLICIES) == 0
    out = capsys.readouterr().out
    assert "sources   3 cells ran from the sources the matrix gives them now" in out


def test_a_cell_from_other_sources_is_stale(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cell = "allreduce[unit,1x2,fp64,autocast=off,reference]@cpu"
    assert gate_main("runtime", _sourced_report(tmp_path, {cell: "0" * 64}), None,
                     POLICIES) == 1
    rows = [ln.split(None, 2) for ln in capsys.readouterr().out.splitlines()[1:-1]]
    assert [(check, name) for check, name, _ in rows] == [("stale", cell)]
    # --matrix replaces the policy's: the same report against another matrix's cells.
    assert gate_main("strict", _sourced_report(tmp_path, {cell: "0" * 64}), None, POLICIES,
                     [RES / "runtime.yaml"]) == 1
    assert "stale" in capsys.readouterr().out


def test_a_report_without_source_digests_is_refused_where_a_matrix_is_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    # runtime.xml: a real run by a cpmatrix older than source digests.
    assert gate_main("runtime", REPORTS / "runtime.xml", None, POLICIES) == 2
    err = capsys.readouterr().err
    assert "no cell carries a source digest" in err and "runtime.yaml" in err
    # Without a matrix there is nothing to check it against: it is gated as before.
    assert gate_main("everything", REPORTS / "runtime.xml", None, POLICIES) == 0
