"""A failed cell, read once: one block per cell, ranks with the same traceback grouped.

- **Grouped**: ranks whose tracebacks are the same but for their numbers (each rank
  compares its own shard) are printed once, as ``ranks 1-3``; the first rank's text is
  shown and the group says the others differ only in numbers.
- **Your frames**: frames of cpmatrix itself (its world, the parity toolkit's insides)
  and of importlib are hidden, a line saying how many; your own frames and the library
  frame that raised stay. ``--full-trace`` shows every frame, as pytest's.
- **Evidence by rank**: a failed cell's evidence is labelled with its rank, the failing
  ranks first (:func:`cpmatrix.supervise.executors.attribution.merge_evidence`).
- **The repro line** to paste ends the block.

Example::

    >>> tb = ('Traceback (most recent call last):\\n'
    ...       '  File "/x/cpmatrix/worker/case.py", line 120, in run_cell\\n    case(ctx)\\n'
    ...       '  File "/me/cases.py", line 15, in f\\n    check(x)\\n'
    ...       'AssertionError: 1 != 2\\n')
    >>> print("\\n".join(trim_traceback(tb)))
    Traceback (most recent call last):
      (1 frame of cpmatrix hidden; --full-trace shows it)
      File "/me/cases.py", line 15, in f
        check(x)
    AssertionError: 1 != 2
    >>> rank_ranges([0, 1, 2, 5])
    'ranks 0-2, 5'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

import cpmatrix
from cpmatrix.result import RankFailure, Result

__all__ = ["failure_block", "group_failures", "rank_ranges", "trim_traceback"]

_FRAME: Final = re.compile(r'^(\s*)File "(?P<file>[^"]+)", line \d+')
#: cpmatrix's own modules, by the folder or file right below the package; the reference
#: suite and the recipes are users of the public API: their frames are shown.
_OWN: Final = frozenset(p.name for p in Path(cpmatrix.__file__).parent.iterdir()
                        if p.name not in ("suite", "recipes", "__pycache__"))
_NUMBER: Final = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?", re.IGNORECASE)
#: Lines of an exception's message shown (its traceback frames are never cut).
_MESSAGE_LINES: Final = 14
_TAIL_LINES: Final = 6


def _hidden_kind(file: str) -> str:
    """``"cpmatrix"``/``"importlib"`` for a frame to hide, ``""`` for one to show."""
    if file.startswith("<frozen importlib") or re.search(r"/importlib/__init__\.py$", file):
        return "importlib"
    parts = file.replace("\\", "/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "cpmatrix" and parts[i + 1] in _OWN:
            return "cpmatrix"
    return ""


def trim_traceback(text: str, *, full: bool = False) -> list[str]:
    """The traceback's lines without cpmatrix's and importlib's frames (``full``: all),
    a line counting each run of hidden frames."""
    lines = text.rstrip("\n").splitlines()
    if full:
        return lines
    out: list[str] = []
    hidden: dict[str, int] = {}
    indent = "  "

    def flush() -> None:
        for kind, n in hidden.items():
            s = "s" if n > 1 else ""
            out.append(f"{indent}({n} frame{s} of {kind} hidden; --full-trace shows "
                       f"{'them' if n > 1 else 'it'})")
        hidden.clear()

    i = 0
    while i < len(lines):
        m = _FRAME.match(lines[i])
        if m is None:
            flush()
            out.append(lines[i])
            i += 1
            continue
        depth = len(m.group(1))
        j = i + 1
        while j < len(lines) and len(lines[j]) - len(lines[j].lstrip()) > depth \
                and not _FRAME.match(lines[j]):
            j += 1
        kind = _hidden_kind(m.group("file"))
        if kind:
            indent = m.group(1)
            hidden[kind] = hidden.get(kind, 0) + 1
        else:
            flush()
            out.extend(lines[i:j])
        i = j
    flush()
    return out


def _shape(failure: RankFailure) -> str:
    """What two ranks must share to be shown once: the traceback and message, numbers
    aside."""
    return _NUMBER.sub("#", f"{failure.check}\n{failure.message}\n{failure.traceback}")


def group_failures(failures: Iterable[RankFailure]) -> list[list[RankFailure]]:
    """The failures by shape (see :func:`_shape`), in the order their first rank came."""
    groups: dict[str, list[RankFailure]] = {}
    for f in failures:
        groups.setdefault(_shape(f), []).append(f)
    return list(groups.values())


def rank_ranges(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 1-3``, ``ranks 0-2, 5``."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    spans: list[str] = []
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return "ranks " + ", ".join(spans)


def _message_lines(lines: list[str]) -> list[str]:
    """The traceback with a long exception message cut (the frames are kept whole)."""
    last_frame = max((i for i, ln in enumerate(lines) if _FRAME.match(ln)), default=-1)
    head, message = lines[:last_frame + 2], lines[last_frame + 2:]
    if len(message) <= _MESSAGE_LINES:
        return lines
    return head + message[:_MESSAGE_LINES] + [f"... ({len(message) - _MESSAGE_LINES} more "
                                              "lines in the report)"]


def _evidence_lines(result: Result) -> list[str]:
    """The evidence, per rank where the ranks differ (failing ranks first, as recorded)."""
    shared: list[str] = []
    by_rank: dict[int, list[str]] = {}
    for key, value in result.evidence.items():
        if key == "case_file":
            continue
        name, _, rank = key.partition("@rank")
        text = f"{name} = {value!r}" if isinstance(value, str) else f"{name} = {value}"
        if rank.isdigit():
            by_rank.setdefault(int(rank), []).append(text)
        else:
            shared.append(text)
    lines = []
    if shared:
        lines.append("  evidence (all ranks): " + ", ".join(shared[:8]))
    failing = set(result.failing_ranks)
    # Ranks with the same values (and the same verdict) share a line, in recorded order.
    groups: dict[tuple[bool, tuple[str, ...]], list[int]] = {}
    for number, texts in by_rank.items():
        groups.setdefault((number in failing, tuple(texts[:8])), []).append(number)
    for (failed, shown), numbers in groups.items():
        tag = " (failed)" if failed else ""
        lines.append(f"  evidence {rank_ranges(numbers)}{tag}: " + ", ".join(shown))
    return lines


def failure_block(key: str, r: Result, *, full_trace: bool = False) -> list[str]:
    """One failed cell's lines: status and id, kind and ranks, each group of ranks with
    its traceback once, the evidence by rank, where its files are, the repro line."""
    ranks = ",".join(map(str, r.failing_ranks)) or "-"
    kind = r.kind.value if r.kind else "-"
    lines = [f"{r.status.label} {key}", f"  kind: {kind}   rank(s): {ranks}"
             + (f"   attempts: {r.attempts}" if r.attempts > 1 else "")]
    if r.runs:  # --runs-per-test: the counts first, then each run that did not pass
        lines.append(f"  runs: {r.runs_passed}/{r.runs} passed")
        lines += [f"  {line}" for line in r.run_failures]
    elif r.message:
        lines.append(f"  {r.message}")
    for group in group_failures(r.failures):
        first = group[0]
        who = rank_ranges([f.rank for f in group])
        same = ""
        if len(group) > 1 and len({f.message + f.traceback for f in group}) > 1:
            same = f" (the same on each; numbers differ: rank {first.rank}'s shown)"
        check = f"  [check: {first.check}]" if first.check else ""
        head = first.message.splitlines()[0] if first.message else ""
        lines.append(f"  {who}: {head}{check}{same}")
        tb = [ln for ln in trim_traceback(first.traceback, full=full_trace) if ln.strip()]
        lines += [f"    {ln}" for ln in _message_lines(tb)]
    if not r.failures:
        for rank, tail in sorted(r.stderr_tails.items()):
            last = [ln for ln in tail.splitlines() if ln.strip()][-_TAIL_LINES:]
            if last:
                who = "launcher" if rank < 0 else f"rank {rank}"
                lines.append(f"  {who} log (last lines):")
                lines += [f"    {ln}" for ln in last]
    lines += _evidence_lines(r)
    if r.out_dir:
        lines.append(f"  files: {r.out_dir}/")
    if r.repro:
        lines.append(f"  repro: {r.repro}")
    return lines
