"""The gate's checks: small pure functions from report cells to :class:`Reason` rows.

Example::

    >>> from ._policy import Policy
    >>> evaluate(Policy(name="r"), []).reasons[0].check     # an empty gate proves nothing
    'empty'
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cpmatrix.gate._policy import Policy
from cpmatrix.repeated import parse_run_statuses, repeated_status
from cpmatrix.report.read import ReportCell
from cpmatrix.result import Status

__all__ = ["CHECKS", "GateResult", "Reason", "check_drift", "check_mutants", "check_spill",
           "check_stale", "check_status", "evaluate", "max_errors"]

_RANK_SUFFIX: Final = re.compile(r"@rank\d+\Z")
#: Order of the reason table: what a release manager must act on first.
CHECKS: Final = ("empty", "missing", "stale", "status", "flaky", "skipped", "spill", "mutants",
                 "drift")
#: The report property holding a result's source digest (``Result.source["digest"]``).
SOURCE_DIGEST: Final = "source.digest"


@dataclass(frozen=True, slots=True)
class Reason:
    """One failing check: a row of the gate's table."""

    check: str
    cell: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GateResult:
    """What :func:`evaluate` found; :func:`cpmatrix.gate.format_gate` prints it."""

    policy: Policy
    required: int
    #: What the present cells were checked against: "matrix", "baseline" or "" (nothing).
    presence: str
    #: Whether a baseline report was given.
    baseline: bool
    #: Status -> number of required cells in the report with it.
    counts: Mapping[str, int]
    mutant_runs: int
    mutants_killed: int
    #: Cells compared against the baseline (None: no baseline given or no drift check).
    drift_compared: int | None
    reasons: tuple[Reason, ...]
    #: Cells whose source digest was checked against the matrix (None: not checked).
    sources_checked: int | None = None

    @property
    def ok(self) -> bool:
        return not self.reasons


def _first_line(cell: ReportCell) -> str:
    lines = [ln.strip() for ln in cell.text.splitlines() if ln.strip()]
    return cell.properties.get("message") or cell.headline or (lines[0] if lines else "")


def _clip(text: str, width: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def check_status(policy: Policy, cells: Iterable[ReportCell]) -> list[Reason]:
    """Required cells passed; flaky and skipped only where the policy allows them."""
    out = []
    for c in cells:
        wrong = _runs_disagree(c)
        if wrong:
            out.append(Reason("status", c.name, _clip(wrong)))
            continue
        if c.status.ok or (c.status is Status.FLAKY and policy.allow_flaky) or (
                c.status is Status.SKIPPED and policy.allow_skipped):
            continue
        if c.status is Status.FLAKY:
            out.append(Reason("flaky", c.name, _clip(
                f"passed only after {c.properties.get('attempts', '?')} attempts: "
                f"{_first_line(c)}")))
        elif c.status is Status.SKIPPED:
            out.append(Reason("skipped", c.name, _clip(_first_line(c) or "skipped")))
        elif c.headline:  # the run's own one-liner: status, kind, ranks, cause
            out.append(Reason("status", c.name, _clip(c.headline)))
        else:
            ranks = c.properties.get("failing_ranks")
            head = c.status.value + (f" on rank {ranks}" if ranks else "")
            out.append(Reason("status", c.name, _clip(f"{head}: {_first_line(c)}")))
    return out


def _runs_disagree(cell: ReportCell) -> str:
    """Why a repeated cell's status cannot be trusted ("" when it can): the rule of
    repeated runs (:func:`cpmatrix.repeated.repeated_status`), re-applied to the run
    statuses the report records, must give the status it records; a repeated cell that
    records no run statuses (a report of an older cpmatrix) can be neither skipped nor
    flaky here, since a failed run may hide behind either.

    >>> cell = ReportCell(name="c", status=Status.SKIPPED,
    ...                   properties={"runs": "3", "run_statuses": "skipped,failed,failed"})
    >>> _runs_disagree(cell)
    'skipped, but its runs (skipped,failed,failed) make it failed (the rule of repeated runs)'
    """
    text = cell.properties.get("run_statuses")
    if text is None:
        if "runs" in cell.properties and cell.status in (Status.SKIPPED, Status.FLAKY):
            return (f"{cell.status.value} over {cell.properties['runs']} runs whose "
                    "statuses the report does not record (rerun with this cpmatrix)")
        return ""
    try:
        status = repeated_status(parse_run_statuses(text))
    except ValueError as exc:
        return f"{cell.status.value}, but its run_statuses are unreadable: {exc}"
    if status is cell.status:
        return ""
    return (f"{cell.status.value}, but its runs ({text}) make it {status.value} "
            "(the rule of repeated runs)")


def check_stale(cells: Iterable[ReportCell], digests: Mapping[str, str]) -> list[Reason]:
    """Each cell ran from the sources its matrix gives it now: its ``source.digest`` is
    the one computed from the matrix (``digests``: cell id -> digest). A cell the matrix
    does not know is the ``missing`` check's business; an interrupted one never ran.

    >>> cell = ReportCell(name="c", status=Status.PASSED, properties={"source.digest": "a"})
    >>> check_stale([cell], {"c": "a"}), [r.check for r in check_stale([cell], {"c": "b"})]
    ([], ['stale'])
    """
    out = []
    for c in cells:
        want = digests.get(c.cell_id)
        if want is None or c.status is Status.INTERRUPTED:
            continue
        got = c.properties.get(SOURCE_DIGEST)
        if not got:
            out.append(Reason("stale", c.name, "no source digest in the report (written by an "
                              "older cpmatrix, or by hand): run the cell again"))
        elif got != want:
            out.append(Reason("stale", c.name, (
                f"ran from other sources: digest {got[:12]} in the report, {want[:12]} from "
                "the matrix now (the case, a module it imports, its matrix entry or "
                "cpmatrix changed since): run the cell again")))
    return out


def _number(cell: ReportCell, key: str) -> float | None:
    raw = cell.evidence.get(key)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return math.nan


def check_spill(cells: Iterable[ReportCell]) -> list[Reason]:
    """Spill stores and spill loads each within the cell's ``budget_bytes`` (default 0)."""
    out = []
    for c in cells:
        store, load = _number(c, "spill_store_bytes"), _number(c, "spill_load_bytes")
        if store is None and load is None:
            continue
        budget = _number(c, "budget_bytes")
        limit = 0.0 if budget is None else budget
        worst = max(v for v in (store, load) if v is not None)
        if math.isnan(worst) or math.isnan(limit) or worst > limit:
            regs = c.evidence.get("registers")
            out.append(Reason("spill", c.name, (
                f"spill stores {c.evidence.get('spill_store_bytes', '-')} B, loads "
                f"{c.evidence.get('spill_load_bytes', '-')} B > budget {limit:g} B"
                + (f" ({regs} registers)" if regs else ""))))
    return out


def check_mutants(policy: Policy, runs: Sequence[ReportCell]) -> list[Reason]:
    """The share of killed mutant runs is at least ``min_kill_rate``; names the survivors.

    A run NOT JUDGED (its unmutated cell did not pass) is left out of the rate: the
    failing cell itself fails the ``status`` check.
    """
    runs = [r for r in runs if r.status is not Status.NOT_JUDGED]
    killed = [r for r in runs if r.evidence.get("mutant_outcome") == "killed"]
    if not runs or len(killed) / len(runs) >= policy.min_kill_rate:
        return []
    out = [Reason("mutants", f"({len(runs)} mutant runs)",
                  f"kill rate {len(killed)}/{len(runs)} = {100 * len(killed) / len(runs):.1f}% "
                  f"< {100 * policy.min_kill_rate:g}%")]
    for r in runs:
        if r not in killed:
            outcome = r.evidence.get("mutant_outcome") or r.status.value
            out.append(Reason("mutants", r.name, _clip(_first_line(r) or outcome)))
    return out


def max_errors(cell: ReportCell, patterns: Sequence[str]) -> dict[str, float]:
    """Evidence values matching ``patterns``; the max over ranks when ranks disagreed.

    >>> c = ReportCell(name="x", status=Status.PASSED, properties={
    ...     "evidence.parity.max_abs": "1e-9", "evidence.parity.max_abs@rank1": "3e-9",
    ...     "evidence.parity.atol": "1e-7"})
    >>> max_errors(c, ["*.max_abs"])
    {'parity.max_abs': 3e-09}
    """
    out: dict[str, float] = {}
    for key, raw in cell.evidence.items():
        base = _RANK_SUFFIX.sub("", key)
        if not any(fnmatch.fnmatchcase(base, p) for p in patterns):
            continue
        try:
            value = float(raw)
        except ValueError:
            continue  # a text note under a matching name: not a measurement
        old = out.get(base)
        # NaN must win: max() would silently keep the finite value.
        out[base] = value if old is None or math.isnan(value) or value > old else old
    return out


def check_drift(policy: Policy, cells: Iterable[ReportCell],
                baseline: Mapping[str, ReportCell]) -> tuple[list[Reason], int]:
    """Errors that grew past ``drift_factor`` x the baseline's; also the cells compared."""
    out, compared = [], 0
    for c in cells:
        old_cell = baseline.get(c.name)
        if old_cell is None or not old_cell.status.ok:
            continue
        old = max_errors(old_cell, policy.drift_keys)
        new = max_errors(c, policy.drift_keys)
        common = sorted(set(old) & set(new))
        compared += bool(common)
        for key in common:
            if math.isnan(old[key]):
                continue
            limit = policy.drift_limit(old[key])
            if math.isnan(new[key]) or new[key] > limit:
                ratio = new[key] / max(old[key], policy.drift_floor)
                floor = f", floor {policy.drift_floor:g}" if old[key] < policy.drift_floor else ""
                out.append(Reason("drift", c.name, (
                    f"{key} {old[key]:.3g} -> {new[key]:.3g} "
                    f"(x{ratio:.3g} > x{policy.drift_factor:g}{floor})")))
    return out, compared


def evaluate(policy: Policy, cells: Sequence[ReportCell],
             baseline: Sequence[ReportCell] | None = None,
             expected: Iterable[str] | None = None,
             digests: Mapping[str, str] | None = None) -> GateResult:
    """Run every check of ``policy`` over a report's cells (pure: no files, no output).

    ``expected``: ids of the cells that must be present (from the policy's matrices);
    without it the baseline's required cells are expected, if a baseline is given.
    ``digests``: cell id -> the source digest the matrix gives it now; with it, a cell
    of the report that ran from other sources is ``stale``.

    >>> ok = ReportCell(name="t[unit,1x1,fp64,autocast=off,reference]@cpu",
    ...                 status=Status.CACHED, properties={"tags": "release"})
    >>> evaluate(Policy(name="r", tags=("release",)), [ok]).ok
    True
    """
    required = policy.scope()

    def in_scope(c: ReportCell) -> bool:
        return required(c.cell_id, c.platform, c.tags)

    runs = [c for c in cells if in_scope(c)]
    plain = [c for c in runs if not c.mutant]
    mutant_runs = [c for c in runs if c.mutant]
    old = {c.name: c for c in baseline or () if in_scope(c) and not c.mutant}
    want = set(expected) if expected is not None else set(old)
    present = {c.name for c in plain}
    reasons = [Reason("missing", cid, "required by the policy, not in the report")
               for cid in sorted(want - present)]
    if not want | present:
        reasons.append(Reason("empty", "-", f"no cell matches {policy.describe_scope()}"))
    if digests is not None:
        reasons += check_stale(runs, digests)
    reasons += check_status(policy, plain)
    reasons += check_spill(plain)
    reasons += check_mutants(policy, mutant_runs)
    compared: int | None = None
    if baseline is not None and policy.drift_factor is not None:
        drift, compared = check_drift(policy, plain, old)
        reasons += drift
    reasons.sort(key=lambda r: CHECKS.index(r.check))  # stable: report order within a check
    return GateResult(
        policy=policy, required=len(want | present), baseline=baseline is not None,
        presence="matrix" if expected is not None else "baseline" if baseline is not None else "",
        counts=Counter(c.status.value for c in plain), mutant_runs=len(mutant_runs),
        mutants_killed=sum(1 for c in mutant_runs
                           if c.evidence.get("mutant_outcome") == "killed"),
        drift_compared=compared, reasons=tuple(reasons),
        sources_checked=None if digests is None else sum(
            1 for c in runs if c.cell_id in digests and c.status is not Status.INTERRUPTED),
    )
