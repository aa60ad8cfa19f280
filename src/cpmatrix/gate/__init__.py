"""The release gate: decide from a merged report whether a release may go out, and say why.

A *policy* (a named entry of ``matrix/gates.yaml``) picks the required cells (tags,
platforms, a ``-k`` expression) and how strict to be. The checks, each a small pure
function over the report's cells:

- ``missing``: every required cell of the policy's matrix files (or, without them, of the
  baseline report) is in the report;
- ``stale``: every required cell ran from the sources its matrix gives it now: the
  ``source.digest`` the run recorded (its spec, case module, the modules that imports,
  cpmatrix's world-side code) is the one computed from the matrix files (``--matrix``,
  default the policy's ``matrix:`` files; with neither, sources are not checked, and
  the verdict says so);
- ``status``: every required cell passed (``cached`` counts as passed); ``skipped`` and
  ``flaky`` fail unless the policy allows them;
- ``spill``: spill cells (evidence ``spill_store_bytes`` / ``spill_load_bytes``) are within
  their ``budget_bytes``;
- ``mutants``: the kill rate of the mutant runs is at least ``min_kill_rate``;
- ``drift``: with a baseline report, no recorded max error grew by more than
  ``drift_factor`` (against at least ``drift_floor``, so a zero baseline is not a trap);
- ``empty``: a policy that selects nothing fails: an empty gate proves nothing.

Example::

    $ cpmatrix gate --policy release --report out/report.xml --baseline last/report.xml
    CHECK   CELL                                             DETAIL
    status  ring[unit,1x1,fp64,autocast=off,reference]@cpu  failed (error) on rank 0,1: ...
    drift   ring[unit,2x2,fp64,autocast=off,reference]@cpu  parity.max_abs 1e-09 -> 5e-09 (x5 > x2)
    FAIL  gate 'release': 2 reasons (1 status, 1 drift) over 14 required cells

From Python, :func:`evaluate` is the pure core (cells in, reasons out)::

    >>> from cpmatrix.report import ReportCell
    >>> cell = ReportCell(name="t[unit,1x1,fp64,autocast=off,reference]@cpu",
    ...                   status=Status.FLAKY, properties={"tags": "release"})
    >>> [r.check for r in evaluate(Policy(name="release", tags=("release",)), [cell]).reasons]
    ['flaky']
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from cpmatrix.errors import ExitCode, SpecError, UsageError
from cpmatrix.gate._checks import CHECKS, SOURCE_DIGEST, GateResult, Reason, evaluate
from cpmatrix.gate._policy import DEFAULT_DRIFT_KEYS, Policy, expected_cells, load_policies
from cpmatrix.matrix.schema import Cell
from cpmatrix.report.read import ReportError, read_report
from cpmatrix.result import Status
from cpmatrix.suggest import suggestion

__all__ = [
    "DEFAULT_DRIFT_KEYS",
    "GateResult",
    "Policy",
    "Reason",
    "decide",
    "evaluate",
    "expected_cells",
    "format_gate",
    "gate_main",
    "load_policies",
]


def format_gate(result: GateResult) -> str:
    """The reason table (one row per failing check) and the verdict line."""
    lines: list[str] = []
    if result.reasons:
        rows = [("CHECK", "CELL", "DETAIL")] + [(r.check, r.cell, r.detail)
                                                for r in result.reasons]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines += [f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
    name = result.policy.name
    if result.reasons:
        per_check = Counter(r.check for r in result.reasons)
        by = ", ".join(f"{n} {check}" for check, n in sorted(
            per_check.items(), key=lambda kv: CHECKS.index(kv[0])))
        n = len(result.reasons)
        lines.append(f"FAIL  gate {name!r}: {n} reason{'s' * (n != 1)} ({by}) over "
                     f"{result.required} required cells")
        return "\n".join(lines)
    # Name every status ("passed" must not hide the skipped or flaky cells a policy allowed)
    # and what was *not* checked: a pass without a matrix or a baseline proves less.
    counts = ", ".join(f"{result.counts[s]} {s}" for s in Status if result.counts.get(s))
    presence = (f"none missing from the {result.presence}" if result.presence
                else "presence not checked (no matrix in the policy, no baseline)")
    lines.append(f"required  {result.required} cells ({counts}); {presence}")
    if result.sources_checked is not None:
        lines.append(f"sources   {result.sources_checked} cells ran from the sources the "
                     "matrix gives them now")
    else:
        lines.append("sources   not checked (no matrix: give --matrix or a matrix: in the "
                     "policy)")
    if result.mutant_runs:
        lines.append(f"mutants   {result.mutants_killed}/{result.mutant_runs} killed")
    if result.drift_compared is not None:
        lines.append(f"drift     within x{result.policy.drift_factor:g} of the baseline for "
                     f"{result.drift_compared} cells")
    else:
        why = "no drift_factor in the policy" if result.baseline else "no baseline"
        lines.append(f"drift     not checked ({why})")
    lines.append(f"PASS  gate {name!r}: every check passed over {result.required} required cells")
    return "\n".join(lines)


def gate_main(policy: str, report: Path, baseline: Path | None, gates_file: Path,
              matrices: Sequence[Path] = ()) -> int:
    """``cpmatrix gate``: print the reasons and the verdict; return the exit code (see
    :func:`decide`)."""
    try:
        result = decide(policy, report, baseline, gates_file, matrices)
    except (SpecError, ReportError, UsageError) as exc:
        print(f"cpmatrix gate: error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    print(format_gate(result))
    return int(ExitCode.OK if result.ok else ExitCode.FAILURES)


def decide(policy: str, report: Path, baseline: Path | None, gates_file: Path,
           matrices: Sequence[Path] = ()) -> GateResult:
    """The gate's verdict on ``report`` under ``policy`` of ``gates_file``.

    ``matrices`` (``--matrix``) replace the policy's ``matrix:`` files: the cells that
    must be present, and the sources each must have run from.

    Raises :class:`SpecError`, :class:`ReportError` or :class:`UsageError` (exit 2) for a
    malformed gates file, an unknown policy, an unreadable report or baseline, or a report
    without source digests where a matrix is given.
    """
    from cpmatrix.cache.provenance import expanded_digests
    from cpmatrix.kinds.pytest.collect import collect_target

    policies = load_policies(gates_file)
    if policy not in policies:
        raise SpecError(os.fspath(gates_file), 0, 0, "", f"no policy {policy!r}",
                        ", ".join(policies), suggestion(policy, policies))
    chosen = policies[policy]
    if matrices:
        chosen = replace(chosen, matrices=tuple(matrices))
    digests: dict[str, str] | None = None
    try:
        expected: list[str] | None = None
        if chosen.matrices:
            digests = {}
            now: list[Cell] = []
            for path in chosen.matrices:  # one expansion each: its cells and digests
                cells_of, digests_of = expanded_digests(path, collect=collect_target)
                now.extend(cells_of)
                digests.update(digests_of)
            expected = [cid for cid, _, _ in expected_cells(chosen, now)]
    except SpecError as exc:  # say which policy pointed at the bad matrix
        if matrices:
            raise  # --matrix named it: the error names the file
        raise SpecError(os.fspath(gates_file), 0, 0, f"policies.{policy}.matrix",
                        str(exc)) from None
    cells = read_report(report)
    old = read_report(baseline) if baseline is not None else None
    if digests is not None and cells and not any(
            c.properties.get(SOURCE_DIGEST) for c in cells):
        raise ReportError(
            f"{report}: no cell carries a source digest (written by a cpmatrix older "
            "than source identities, or by another tool): it cannot be checked against "
            f"{', '.join(map(str, chosen.matrices))}; run the cells again")
    return evaluate(chosen, cells, old, expected, digests)
