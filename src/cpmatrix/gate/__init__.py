"""The release gate: decide from a merged report whether a release may go out, and say why.

A *policy* (a named entry of ``matrix/gates.yaml``) picks the required cells (tags,
platforms, a ``-k`` expression) and how strict to be. The checks, each a small pure
function over the report's cells:

- ``missing``: every required cell of the policy's matrix files (or, without them, of the
  baseline report) is in the report;
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
from pathlib import Path

from cpmatrix.errors import ExitCode, SpecError, UsageError
from cpmatrix.gate._checks import CHECKS, GateResult, Reason, evaluate
from cpmatrix.gate._policy import DEFAULT_DRIFT_KEYS, Policy, expected_cells, load_policies
from cpmatrix.report.read import ReportError, read_report
from cpmatrix.result import Status

__all__ = [
    "DEFAULT_DRIFT_KEYS",
    "GateResult",
    "Policy",
    "Reason",
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


def gate_main(policy: str, report: Path, baseline: Path | None, gates_file: Path) -> int:
    """``cpmatrix gate``: print the reasons and the verdict; return the exit code.

    0: the gate passed; 1: it failed (reasons printed); 2: a malformed gates file, an
    unknown policy or an unreadable report or baseline (one line on stderr).
    """
    try:
        policies = load_policies(gates_file)
        if policy not in policies:
            raise SpecError(os.fspath(gates_file), 0, 0, "", f"no policy {policy!r}",
                            ", ".join(policies))
        chosen = policies[policy]
        try:
            expected = [cid for cid, _, _ in expected_cells(chosen)] if chosen.matrices else None
        except SpecError as exc:  # say which policy pointed at the bad matrix
            raise SpecError(os.fspath(gates_file), 0, 0, f"policies.{policy}.matrix",
                            str(exc)) from None
        cells = read_report(report)
        old = read_report(baseline) if baseline is not None else None
    except (SpecError, ReportError, UsageError) as exc:
        print(f"cpmatrix gate: error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    result = evaluate(chosen, cells, old, expected)
    print(format_gate(result))
    return int(ExitCode.OK if result.ok else ExitCode.FAILURES)
