"""What became of a cell: :class:`Status`, :class:`Result`, serializable both ways.

Every planned cell ends as exactly one Result.

Example::

    >>> r = Result(cell_id="t[unit,1x1,fp64,autocast=off,reference]@cpu", status=Status.PASSED)
    >>> Result.from_dict(r.to_dict()) == r
    True
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = ["MUTANT_MARK", "SHARED_CHECK", "STATE_CHECK", "FailureKind", "RankFailure", "Result",
           "Status", "read_results", "split_testcase_name", "target_of", "testcase_name"]

#: ``RankFailure.check`` of a cell that changed what cannot be restored in its ranks'
#: processes (they run no later cell), and of one that broke what the world shares (its
#: groups, its collectives' pairing, stray processes: not reused, the ranks go on).
STATE_CHECK = "process_state"
SHARED_CHECK = "process_shared"

#: Separates a cell id from the mutant switched on in a testcase name.
MUTANT_MARK = "!mutant="


def testcase_name(cell_id: str, mutant: str = "") -> str:
    """A cell's name in a report; a mutant run is its own testcase.

    >>> testcase_name("t[unit,1x1,fp64,autocast=off,reference]@cpu", "bug")
    't[unit,1x1,fp64,autocast=off,reference]@cpu!mutant=bug'
    """
    return f"{cell_id}{MUTANT_MARK}{mutant}" if mutant else cell_id


def split_testcase_name(name: str) -> tuple[str, str]:
    """``(cell id, mutant)`` of a testcase name (mutant ``""`` for a plain run).

    >>> split_testcase_name("t@cpu!mutant=bug")
    ('t@cpu', 'bug')
    """
    cell_id, _, mutant = name.partition(MUTANT_MARK)
    return cell_id, mutant


def target_of(cell_id: str) -> str:
    """The target a cell id (or a prefix of one) names, without parsing the rest: the
    one place that cuts it, for ids of any age or form.

    >>> target_of("t[unit,1x1,fp64,autocast=off,reference]@cpu"), target_of("t@cpu")
    ('t', 't')
    """
    return cell_id.split("[", 1)[0].split("@", 1)[0]


class Status(StrEnum):
    PASSED = "passed"
    CACHED = "cached"
    FAILED = "failed"
    FLAKY = "flaky"
    TIMEOUT = "timeout"
    CRASH = "crash"
    SKIPPED = "skipped"
    #: The run was stopped (Ctrl-C, SIGTERM) before the cell finished. Never ok, and no
    #: gate policy can allow it (unlike SKIPPED).
    INTERRUPTED = "interrupted"
    #: The infrastructure ended the cell's job from outside (a Slurm job cancelled, past
    #: its time limit, its node failed) again and again: the cell has no verdict of its
    #: own. Not a failure of the cell, never ok, and no gate policy can allow it.
    INFRA = "infra"
    #: Mutant runs (``--mutants``) only: the planted bug made the cell fail (ok).
    KILLED = "killed"
    #: The cell passed with the bug planted: the test is vacuous for it (not ok).
    SURVIVED = "survived"
    #: The unmutated cell did not pass in the same run, so a failure with the bug planted
    #: proves nothing: left out of the kill rate (not ok).
    NOT_JUDGED = "not_judged"

    @property
    def ok(self) -> bool:
        """Passed (fresh or cached), or a mutant killed. FLAKY passed on retry but is not
        ok for a gate."""
        return self in (Status.PASSED, Status.CACHED, Status.KILLED)

    @property
    def label(self) -> str:
        """How the CLI writes it: ``PASSED``, ``KILLED``, ``NOT JUDGED``.

        >>> Status.NOT_JUDGED.label
        'NOT JUDGED'
        """
        return self.value.replace("_", " ").upper()


class FailureKind(StrEnum):
    #: A Python exception in the case (any rank).
    ERROR = "error"
    #: A rank died (signal, os._exit, segfault) or the world broke without a traceback.
    CRASH = "crash"
    #: The cell ran past its timeout (hang or endless loop).
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankFailure:
    """What one failing rank left behind."""

    rank: int
    #: Exception type and message, or how the rank died.
    message: str
    #: Full traceback (error), Python stacks (timeout) or empty (crash).
    traceback: str = ""
    #: The toolkit check that raised (``ParityError.check``), if any.
    check: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    cell_id: str
    status: Status
    kind: FailureKind | None = None
    failing_ranks: tuple[int, ...] = ()
    failures: tuple[RankFailure, ...] = ()
    #: The last lines of every rank's log during the cell (on failure).
    stderr_tails: dict[int, str] = field(default_factory=dict)
    #: Evidence from ``cell.record``; a key only some ranks agree on gets ``@rankN``.
    evidence: dict[str, Any] = field(default_factory=dict)
    #: Wall time of the cell in its world (max over ranks) and of the case alone.
    duration_s: float = 0.0
    case_s: float = 0.0
    attempts: int = 1
    #: Free-form explanation (e.g. "passed on retry after: crash ...").
    message: str = ""
    #: Where the cell's files are (relative to the run's output folder).
    out_dir: str = ""
    #: The mutant switched on for this run, if any.
    mutant: str = ""
    #: The sources the result was produced from (:mod:`cpmatrix.cache.provenance`):
    #: ``digest`` (the cell's), ``matrix``, ``cpmatrix``, ``commit``. Empty in reports
    #: of cpmatrix versions before it.
    source: dict[str, str] = field(default_factory=dict)
    #: ``--runs-per-test N`` (N > 1): the cell's runs, how many passed, and one line per
    #: run that did not (``run 3: failed (error) on rank 0: ...``). 0 and () for one run
    #: (left out of :meth:`to_dict` then).
    runs: int = 0
    runs_passed: int = 0
    run_failures: tuple[str, ...] = ()
    #: Each run's own status, in run order: what :func:`cpmatrix.repeated.repeated_status`
    #: made ``status`` from (the gate re-applies the rule to it).
    run_statuses: tuple[Status, ...] = ()
    #: The command that reruns this cell alone (``cpmatrix repro '<id>' ...``), quoted for a
    #: POSIX shell; set on a cell that did not pass, "" otherwise (left out of
    #: :meth:`to_dict` then).
    repro: str = ""
    #: What the cell read (path -> signature, merged over its ranks), for the result
    #: cache; None when not observed. In memory only: never in results.json or reports.
    reads: dict[str, str] | None = field(default=None, compare=False, repr=False)
    #: What the cell's kind judged of this result, for its front to replay instead of
    #: judging again (a pytest cell's verdict and its ranks' reports:
    #: :class:`cpmatrix.kinds.pytest.records.Judged`). In memory only, like ``reads``.
    judged: object | None = field(default=None, compare=False, repr=False)

    @property
    def first_failure(self) -> RankFailure | None:
        return self.failures[0] if self.failures else None

    def headline(self) -> str:
        """One line for summaries: status, kind, ranks and the first line of the cause."""
        if self.status.ok:
            return f"{self.status.value}"
        ranks = ",".join(map(str, self.failing_ranks)) or "?"
        first = self.first_failure
        cause = first.message.splitlines()[0] if first and first.message else self.message
        kind = f" ({self.kind.value})" if self.kind else ""
        return f"{self.status.value}{kind} on rank {ranks}: {cause}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, reads=None, judged=None))  # (never copied: in memory only)
        d["status"] = self.status.value
        d["kind"] = self.kind.value if self.kind else None
        d["failing_ranks"] = list(self.failing_ranks)
        d["failures"] = [asdict(f) for f in self.failures]
        d["stderr_tails"] = {str(k): v for k, v in self.stderr_tails.items()}
        del d["reads"], d["judged"]
        if self.runs:
            d["run_failures"] = list(self.run_failures)
            d["run_statuses"] = [s.value for s in self.run_statuses]
        else:  # only a repeated run's rows carry these (from_dict reads them back as 0)
            for key in ("runs", "runs_passed", "run_failures", "run_statuses"):
                del d[key]
        if not self.repro:
            del d["repro"]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Result:
        """The inverse of :meth:`to_dict`; ``ValueError`` naming the field for a wrong shape.

        Cache entries and result files come from disk: a field of the wrong type must be a
        clean "ignore this entry", never an exception deep inside a run.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a result must be a mapping, got {type(d).__name__}")
        try:
            return cls(
                cell_id=_typed(d, "cell_id", str, None),
                status=Status(_typed(d, "status", str, None)),
                kind=FailureKind(d["kind"]) if d.get("kind") else None,
                failing_ranks=tuple(_ints(_typed(d, "failing_ranks", list, []),
                                          "failing_ranks")),
                failures=tuple(_failure(f) for f in _typed(d, "failures", list, [])),
                stderr_tails={int(k): _str(v, "stderr_tails")
                              for k, v in _typed(d, "stderr_tails", dict, {}).items()},
                evidence=dict(_typed(d, "evidence", dict, {})),
                duration_s=float(_typed(d, "duration_s", (int, float), 0.0)),
                case_s=float(_typed(d, "case_s", (int, float), 0.0)),
                attempts=int(_typed(d, "attempts", int, 1)),
                message=_typed(d, "message", str, ""),
                out_dir=_typed(d, "out_dir", str, ""),
                mutant=_typed(d, "mutant", str, ""),
                source={str(k): _str(v, "source")
                        for k, v in _typed(d, "source", dict, {}).items()},
                runs=int(_typed(d, "runs", int, 0)),
                runs_passed=int(_typed(d, "runs_passed", int, 0)),
                run_failures=tuple(_str(v, "run_failures")
                                   for v in _typed(d, "run_failures", list, [])),
                run_statuses=tuple(Status(_str(v, "run_statuses"))
                                   for v in _typed(d, "run_statuses", list, [])),
                repro=_typed(d, "repro", str, ""),
            )
        except (TypeError, KeyError) as exc:
            raise ValueError(f"malformed result: {exc}") from None


def _typed(d: dict[str, Any], key: str, kind: Any, default: Any) -> Any:
    """``d[key]`` if it has type ``kind``; ``default`` when absent (None: required)."""
    if key not in d:
        if default is None:
            raise ValueError(f"malformed result: missing {key!r}")
        return default
    value = d[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ValueError(f"malformed result: {key} is {type(value).__name__}, "
                         f"not {getattr(kind, '__name__', kind)}")
    return value


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"malformed result: {key} holds {type(value).__name__}")
    return value


def _ints(values: list[Any], key: str) -> list[int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"malformed result: {key} must hold integers")
    return values


def _failure(f: Any) -> RankFailure:
    if not isinstance(f, dict):
        raise ValueError(f"malformed result: failures hold {type(f).__name__}, not mappings")
    return RankFailure(rank=_typed(f, "rank", int, None), message=_typed(f, "message", str, ""),
                       traceback=_typed(f, "traceback", str, ""), check=_typed(f, "check", str, ""))


def read_results(path: str | os.PathLike[str]) -> list[Result]:
    """A ``results.json`` (a run's or a merge's: ``RunLayout(out).results``): the one
    reader. ``FileNotFoundError`` when absent; ``ValueError`` naming the file when it is
    not a list of results.

    >>> import json, tempfile
    >>> f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    >>> _ = f.write(json.dumps([Result(cell_id="c", status=Status.PASSED).to_dict()]))
    >>> f.close()
    >>> [r.cell_id for r in read_results(f.name)]
    ['c']
    """
    where = os.fspath(path)
    with open(where, encoding="utf-8") as f:
        try:
            rows = json.load(f)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(rows, list):
        raise ValueError(f"{where}: expected a list of results, got {type(rows).__name__}")
    try:
        return [Result.from_dict(r) for r in rows]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{where}: {exc}") from None
