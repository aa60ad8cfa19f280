"""Outcomes come from the rank process itself, never from a child it forked (in the ranks).

A case may fork (``os.fork``, multiprocessing's fork start method). A forked child is a
copy of the rank, on the rank's stack: if it returns or raises out of the case it would
carry on in cpmatrix's worker loop, write the rank's outcome, run the next cells, take
part in the rank's collectives. So the worker notes its own pid before each case, and
code that finds itself in another process right after the case (:func:`leave_if_child`)
ends that process at once with ``os._exit``:

- a child that raised ``SystemExit`` (``sys.exit(n)``) exits with ``n``: the child's own
  business, never recorded as the rank's error;
- a child that returned or raised anything else leaves a note (``WorldFolder.stray``) and
  exits (0 after a return, 1 after an exception, as a script would); the rank fails the
  cell naming the child (:func:`strays`), once it has ended every child the cell left.

multiprocessing's own children end with ``os._exit`` already and never get here.
Standard library only.

Example::

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> strays(d, 3, 1)
    []
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from cpmatrix.worker.protocol import WorldFolder

__all__ = ["leave_if_child", "strays"]


def leave_if_child(owner: int, world_dir: str, index: int, rank: int,
                   exc: BaseException | None) -> None:
    """End this process now if it is not ``owner`` (a case's forked child that came back
    out of the case); otherwise return."""
    pid = os.getpid()
    if pid == owner:
        return
    code = 0
    try:
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        else:
            code = 0 if exc is None else 1
            how = "returned" if exc is None else f"raised {type(exc).__name__}: {exc}"
            note = WorldFolder(Path(world_dir)).stray(index, rank, pid)
            note.parent.mkdir(parents=True, exist_ok=True)
            note.write_text(how, encoding="utf-8")
            print(f"cpmatrix worker: a forked child (pid {pid}) of the case {how} out of "
                  f"the case into cpmatrix; it ends here (os._exit({code})). A forked "
                  "child must end with os._exit", file=sys.stderr)
            if exc is not None:
                traceback.print_exception(exc, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def strays(world_dir: str, index: int, rank: int) -> list[str]:
    """What the case's children that came back into cpmatrix did (one line each)."""
    out = []
    for pid, note in WorldFolder(Path(world_dir)).strays_of(index, rank).items():
        try:
            how = note.read_text(encoding="utf-8")
        except OSError:
            how = "came back"
        out.append(f"a forked child (pid {pid}) of the case {how} out of the case into "
                   "cpmatrix's worker instead of ending with os._exit; it was ended, and "
                   "its outcome ignored (outcomes come from the rank process only)")
    return out
