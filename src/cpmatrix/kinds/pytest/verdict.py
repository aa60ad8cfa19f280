"""One test's outcome from every rank's pytest reports and the world's result. Pure.

Each rank of a cell runs the test in its own pytest session and leaves its reports (one
per phase: setup, call, teardown), each classified as ``passed``, ``failed``,
``skipped``, ``xfailed`` or ``xpassed`` (:class:`RankPhase`). The world adds what only
it knows (:class:`Fault`): a rank that died, a hang past the timeout, process state the
test left behind. :func:`judge` merges them into one :class:`Verdict`, phase by phase:

- a phase failed on any rank fails; the report that stands for it is the failing rank
  cpmatrix's attribution names first (its own error, not an echo of a peer's), else the
  lowest failing rank;
- a skip must be agreed: skipped on every rank is a skip; skipped on some and passed on
  others is a failure that names both (skipped on one and failed on another: a failure);
- ``xfail``: failed as expected on some ranks and passed on the others is ``xfailed``
  (the test as a whole failed, as expected); ``xpassed`` only when every rank passed;
- a rank with no report for a phase: the fault's (a crash, a hang: the test fails in the
  first phase a faulty rank did not finish, naming the rank and the cause); without a
  fault, it was torn down waiting for a failing peer (noted), or it is a failure;
- a fault after every phase passed (state the test left) fails the teardown phase.

Example::

    >>> ok = RankPhase(when="call", outcome="passed", kind="passed", summary="")
    >>> skip = RankPhase(when="call", outcome="skipped", kind="skipped", summary="no gpu")
    >>> su = RankPhase(when="setup", outcome="passed", kind="passed", summary="")
    >>> judge({0: [su, ok], 1: [su, skip]}, size=2).summary()
    'failed: skip not agreed: skipped on rank 1 (no gpu), passed on rank 0'
    >>> judge({0: [su, skip], 1: [su, skip]}, size=2).summary()
    'skipped: no gpu'
    >>> judge({0: [su, skip], 1: [su, skip]}, size=2).outcome
    'skipped'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from cpmatrix.result import STATE_CHECK, FailureKind, RankFailure, Result, Status

__all__ = ["PHASES", "Fault", "PhaseVerdict", "RankPhase", "Verdict", "fault_of", "is_own",
           "judge", "ranks_text"]

PHASES: Final = ("setup", "call", "teardown")
#: ``RankFailure.check`` of a test that failed in pytest's own terms (the rank's
#: reports tell the story); any other check is cpmatrix's (a :class:`Fault`).
PYTEST_CHECK: Final = "pytest"


def is_own(failure: RankFailure) -> bool:
    """Whether a rank's failure is cpmatrix's own (its checks, the process-state watch:
    what the rank's pytest reports cannot say), not the test's."""
    return failure.check != PYTEST_CHECK or "process_state:" in failure.message


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPhase:
    """One rank's report of one phase."""

    when: str
    #: pytest's outcome: passed, failed, skipped.
    outcome: str
    #: What it means: passed, failed, skipped, xfailed, xpassed.
    kind: str
    #: One line: the exception, the skip or xfail reason.
    summary: str
    #: The long representation (traceback), if any.
    text: str = ""
    duration: float = 0.0
    #: Its position in the rank's list of reports (the controller replays that report).
    index: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankPhase:
        return cls(when=str(data["when"]), outcome=str(data["outcome"]),
                   kind=str(data["kind"]), summary=str(data.get("summary", "")),
                   text=str(data.get("text", "")), duration=float(data.get("duration", 0.0)),
                   index=int(data.get("index", 0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """What the world saw that the ranks' reports cannot say."""

    #: crash, timeout, error (cpmatrix's own check, e.g. process_state), flaky,
    #: interrupted.
    kind: str
    ranks: tuple[int, ...]
    message: str
    #: Stacks of a hang, the rank's traceback of an error.
    details: str = ""
    #: Only what the test left behind in the process (check ``process_state``), nothing
    #: of its own outcome.
    state_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseVerdict:
    """A phase as reported: a rank's own report (``rank``), or one made from ``message``."""

    when: str
    #: What pytest is told: passed, failed, skipped.
    outcome: str
    kind: str
    #: The rank whose report stands for the phase; None: a report made from ``message``.
    rank: int | None
    #: The long representation of a made report, or a note added to the rank's report.
    message: str = ""
    #: The slowest rank's.
    duration: float = 0.0
    #: One line: the standing report's exception or reason, or the made report's.
    summary: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The test's outcome: passed, failed, error (setup/teardown), skipped, xfailed,
    xpassed."""

    outcome: str
    phases: tuple[PhaseVerdict, ...]
    failing_ranks: tuple[int, ...] = ()
    #: One line on why (the skip reason, the failure's first line).
    reason: str = ""
    #: What a test that did not fail left behind in its ranks' process (``process_state:
    #: ...``): noted, not its outcome. "" if nothing.
    left_state: str = ""

    @property
    def ok(self) -> bool:
        """Not a failure (skips count as ok here; the caller decides what a skip means)."""
        return self.outcome not in ("failed", "error")

    def summary(self) -> str:
        return f"{self.outcome}: {self.reason}" if self.reason else self.outcome


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 1`` / ``ranks 0, 2``.

    >>> ranks_text([2]), ranks_text([0, 3])
    ('rank 2', 'ranks 0, 3')
    """
    rs = sorted(ranks)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def fault_of(result: Result) -> Fault | None:
    """What the world's result says beyond the ranks' own pytest reports."""
    if result.status in (Status.PASSED, Status.CACHED, Status.SKIPPED):
        return None
    details = "\n".join(
        f"--- rank {f.rank}: {f.message}\n{f.traceback}".rstrip() for f in result.failures
        if f.traceback or result.kind is not FailureKind.ERROR)
    if result.status is Status.INTERRUPTED:
        return Fault(kind="interrupted", ranks=(), message=result.message)
    if result.status is Status.FLAKY:
        return Fault(kind="flaky", ranks=result.failing_ranks, message=result.message,
                     details=details)
    if result.kind in (FailureKind.CRASH, FailureKind.TIMEOUT):
        first = result.first_failure
        message = result.message or (first.message if first else "")
        return Fault(kind=result.kind.value, ranks=result.failing_ranks, message=message,
                     details=details)
    own = [f for f in result.failures if is_own(f)]
    if not own:
        return None
    return Fault(kind="error", ranks=tuple(sorted({f.rank for f in own})),
                 message="; ".join(dict.fromkeys(_own_message(f.message) for f in own)),
                 details="\n".join(f"--- rank {f.rank}\n{f.traceback}".rstrip()
                                   for f in own if f.traceback and f.check != PYTEST_CHECK),
                 state_only=all(f.check == STATE_CHECK for f in own))


def _own_message(message: str) -> str:
    """The cpmatrix part of a failure message (a state problem appended to a test's)."""
    at = message.find("process_state:")
    return message[at:] if at >= 0 else message


def _pick(ranks: Sequence[int], primary: Sequence[int]) -> int:
    first = [r for r in primary if r in ranks]
    return first[0] if first else min(ranks)


def _reason(p: RankPhase) -> str:
    return p.summary.splitlines()[0] if p.summary else p.kind


def _merge_phase(when: str, got: Mapping[int, RankPhase],
                 primary: Sequence[int]) -> PhaseVerdict:
    """One phase of every rank that reported it (``got``; ranks without one are the
    caller's to explain)."""
    by: dict[str, list[int]] = {}
    for r, p in sorted(got.items()):
        by.setdefault(p.kind, []).append(r)
    duration = max((p.duration for p in got.values()), default=0.0)
    if "xpassed" in by and "xfailed" not in by and "failed" not in by:
        # A strict xfail that passed fails on its rank (pytest's own verdict there),
        # whatever its peers did.
        strict = [r for r in by["xpassed"] if got[r].outcome == "failed"]
        if strict:
            by["failed"] = strict
            by["xpassed"] = [r for r in by["xpassed"] if r not in strict]
            if not by["xpassed"]:
                del by["xpassed"]
    if "failed" in by:
        r = _pick(by["failed"], primary)
        others = [k for k in by if k != "failed"]
        note = ""
        if "skipped" in by:
            note = (f"skipped on {ranks_text(by['skipped'])} "
                    f"({_reason(got[by['skipped'][0]])}) but failed on "
                    f"{ranks_text(by['failed'])}: a skip must be agreed by every rank")
        elif others and len(by["failed"]) < len(got):
            note = f"failed on {ranks_text(by['failed'])}, " + ", ".join(
                f"{k} on {ranks_text(by[k])}" for k in others)
        return PhaseVerdict(when=when, outcome="failed", kind="failed", rank=r,
                            message=note, duration=duration, summary=_reason(got[r]))
    if "xfailed" in by:
        r = by["xfailed"][0]
        plain = [rk for k, rs in by.items() if k not in ("xfailed", "xpassed") for rk in rs]
        note = ""
        if "xpassed" in by:
            note = (f"failed as expected on {ranks_text(by['xfailed'])}, passed on "
                    f"{ranks_text(by['xpassed'])}")
        if plain:
            note = (note + "; " if note else "") + (
                f"no xfail on {ranks_text(plain)} ({', '.join(sorted(by))}): every rank "
                "should agree on the xfail marker")
        return PhaseVerdict(when=when, outcome=got[r].outcome, kind="xfailed", rank=r,
                            message=note, duration=duration, summary=_reason(got[r]))
    if "skipped" in by:
        if len(by) == 1:
            r = by["skipped"][0]
            return PhaseVerdict(when=when, outcome="skipped", kind="skipped", rank=r,
                                duration=duration, summary=_reason(got[r]))
        rest = [rk for k, rs in by.items() if k != "skipped" for rk in rs]
        return _made(when, f"skip not agreed: skipped on {ranks_text(by['skipped'])} "
                     f"({_reason(got[by['skipped'][0]])}), passed on {ranks_text(rest)}",
                     duration)
    if "xpassed" in by and len(by) == 1:
        r = min(by["xpassed"])
        return PhaseVerdict(when=when, outcome=got[r].outcome, kind="xpassed", rank=r,
                            duration=duration, summary=_reason(got[r]))
    r = min(got)
    return PhaseVerdict(when=when, outcome="passed", kind="passed", rank=r,
                        duration=duration)


def _made(when: str, message: str, duration: float = 0.0) -> PhaseVerdict:
    first = message.splitlines()[0] if message else ""
    return PhaseVerdict(when=when, outcome="failed", kind="failed", rank=None,
                        message=message, duration=duration,
                        summary=first.removeprefix("cpmatrix: "))


def _fault_text(fault: Fault, size: int) -> str:
    ranks = fault.ranks
    who = f"{ranks_text(ranks)} of {size}" if ranks else f"a rank of {size}"
    verb = "was" if len(ranks) == 1 else "were"
    head = {
        "crash": f"cpmatrix: {who} died during the test",
        "timeout": f"cpmatrix: the test hung: {fault.message}; {who} {verb} still in it "
                   "(stacks below)",
        "flaky": "cpmatrix: flaky: a rank died during the test, and the test passed when "
                 "run again alone in a fresh world",
        "error": f"cpmatrix: {fault.message}",
    }.get(fault.kind, f"cpmatrix: {fault.kind}: {fault.message}")
    lines = [head]
    if fault.kind in ("crash", "flaky") and fault.message:
        lines.append(f"(the world: {fault.message})")
    if fault.details:
        lines.append(fault.details)
    return "\n".join(lines)


def judge(ranks: Mapping[int, Sequence[RankPhase]], *, size: int,
          result: Result | None = None,
          cut_off: Mapping[int, Sequence[str]] | None = None) -> Verdict:
    """The test's verdict from each rank's phases (``ranks``: rank -> its reports, in
    order; a rank absent sent none) and the world's ``result`` (None: all ranks ended).
    ``cut_off``: rank -> the phases it was cut off in by a peer that failed or skipped
    (their reports are not the rank's own: it sent none for them)."""
    cut = cut_off or {}
    fault = fault_of(result) if result is not None else None
    primary = tuple(result.failing_ranks) if result is not None else ()
    by_phase = {when: {r: p for r, ps in ranks.items() for p in ps if p.when == when}
                for when in PHASES}
    phases: list[PhaseVerdict] = []
    failing: list[int] = []
    if fault is not None and fault.kind == "flaky":
        phases = [_made("call", _fault_text(fault, size))]
        return Verdict(outcome="failed", phases=(*phases, _passed("teardown")),
                       failing_ranks=fault.ranks, reason=f"flaky: {fault.message}")
    for when in PHASES:
        got = by_phase[when]
        missing = [r for r in range(size) if r not in got]
        failed_before = any(p.outcome == "failed" or p.kind == "xfailed" for p in phases)
        if fault is not None and fault.kind in ("crash", "timeout") and (
                set(missing) & set(fault.ranks) or not got):
            # The first phase a faulty rank did not finish: the fault is its story.
            phases.append(_made(when, _fault_text(fault, size)))
            failing.extend(fault.ranks)
            fault = None
            if when != "teardown":
                phases.append(_passed("teardown"))
            break
        if when == "call" and phases and phases[-1].outcome != "passed":
            continue  # no call phase after a setup that failed or skipped, as in pytest
        if not got:
            if when == "teardown":
                phases.append(_passed(when))
            elif not failed_before:
                phases.append(_made(when, f"cpmatrix: no rank reported the {when} phase"))
                phases.append(_passed("teardown"))
                break
            continue
        merged = _merge_phase(when, got, primary)
        if missing and not failed_before:
            # (After a failure, ranks torn down while waiting for it report no more; an
            # expected failure is a failure the peers waiting for it were cut off by.)
            told = [r for r in missing if when in cut.get(r, ())]
            how = "cut off" if told == missing else "torn down"
            if merged.rank is not None and (merged.outcome == "failed"
                                            or merged.kind == "xfailed"):
                merged = _with_note(merged, f"{ranks_text(missing)} did not finish the "
                                    f"{when} phase ({how} while waiting for the failing "
                                    "rank)")
            elif merged.kind == "skipped" and told:
                merged = _made(when, f"cpmatrix: skip not agreed: skipped on "
                               f"{ranks_text(sorted(got))} ({merged.summary}), "
                               f"{ranks_text(told)} cut off waiting for it in a collective",
                               merged.duration)
            else:
                merged = _made(when, f"cpmatrix: {ranks_text(missing)} sent no report for "
                               f"the {when} phase", merged.duration)
        phases.append(merged)
        if merged.outcome == "failed":
            failing.append(merged.rank if merged.rank is not None else -1)
    if fault is not None and fault.kind in ("error", "crash", "timeout"):
        failed = [i for i, p in enumerate(phases) if p.outcome == "failed"]
        text = _fault_text(fault, size)
        if failed:
            i = failed[0]
            phases[i] = _with_note(phases[i], text)
        elif fault.state_only:
            # Every phase passed; the test left state behind. Natively its ranks end with
            # it (or a later test meets it): never the test's own outcome. The rank runs
            # no more tests (the world is recycled), the note says what was left.
            end = len(phases) - 1
            phases[end] = _with_note(phases[end], text)
            return replace(_verdict(phases, failing), left_state=fault.message)
        else:
            # Every phase passed, then the world found what the test left behind.
            last = next((i for i, p in enumerate(phases) if p.when == "teardown"), None)
            made = _made("teardown", text)
            if last is None:
                phases.append(made)
            else:
                phases[last] = made
        failing.extend(fault.ranks)
    return _verdict(phases, failing)


def _passed(when: str) -> PhaseVerdict:
    return PhaseVerdict(when=when, outcome="passed", kind="passed", rank=None)


def _with_note(p: PhaseVerdict, note: str) -> PhaseVerdict:
    return replace(p, message=f"{p.message}\n{note}" if p.message else note)


def _verdict(phases: list[PhaseVerdict], failing: list[int]) -> Verdict:
    ranks = tuple(sorted({r for r in failing if r >= 0}))
    failed = [p for p in phases if p.outcome == "failed"]
    if failed:
        first = failed[0]
        outcome = "failed" if first.when == "call" else "error"
        where = f" (rank {first.rank})" if first.rank is not None else ""
        return Verdict(outcome=outcome, phases=tuple(phases), failing_ranks=ranks,
                       reason=f"{first.summary}{where}")
    setup = next((p for p in phases if p.when == "setup"), None)
    call = next((p for p in phases if p.when == "call"), None)
    main = call if call is not None else setup
    if main is None:
        return Verdict(outcome="passed", phases=tuple(phases), failing_ranks=ranks)
    reason = main.summary if main.kind != "passed" else ""
    return Verdict(outcome=main.kind, phases=tuple(phases), failing_ranks=ranks,
                   reason=reason)
