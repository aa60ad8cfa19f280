"""The run's output folder: claimed by one run at a time, emptied only of our own files.

``claim(out)`` is the first thing ``cpmatrix run`` does with ``--out``:

- **Ownership.** A folder cpmatrix made holds the marker ``.cpmatrix-out``. An existing
  folder without it that holds anything is refused (exit 2): a run never deletes a
  user's files. An empty or new folder is adopted.
- **One run at a time.** An exclusive ``flock`` on ``.cpmatrix.lock`` is held until the
  process exits (the kernel drops it even on SIGKILL); a second run on the same folder
  exits 2 naming the run that holds it (pid, host, start time, run id).
- **The last evidence survives.** Claiming deletes nothing. Only a run that has cells
  to run (:meth:`OutClaim.take_over`, called once the run is prepared: selection,
  devices, runner, interpreter and cache all settled) moves the previous run's report
  files and ``worlds/``, ``cells/``, ``spill/`` into ``previous/`` (replacing the one
  before) and starts afresh. A run that selects nothing (exit 3), fails to load or to
  prepare (exit 2) or is refused the folder leaves every file as it was; an interrupted
  run writes its report (its unfinished cells ``interrupted``) beside ``previous/``; a
  killed run's leftovers (no report) never replace a ``previous/`` that holds a report.
  ``durations.json`` (timing history for the planner) stays in the folder, a copy of it
  goes into ``previous/``.

Example::

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> claim = claim_out(out)
    >>> (out / MARKER).exists(), len(claim.run_id)
    (True, 12)
    >>> _ = (out / REPORT_XML).write_text("<testsuites/>")  # the last run's report
    >>> claim.take_over()  # this run has cells: the last run's files go to previous/
    >>> (out / REPORT_XML).exists(), (out / PREVIOUS / REPORT_XML).exists()
    (False, True)
    >>> claim.release()  # the lock file closes here (else at exit: an unclosed file)
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from cpmatrix.errors import UsageError
from cpmatrix.layout import DURATIONS, LOCK, MARKER, OUTPUTS, PREVIOUS, REPORT_XML, RESULTS

__all__ = ["OutClaim", "claim_out", "keep_previous"]

#: Where :func:`keep_previous` assembles ``previous/`` and puts the one it replaces, so
#: that the swap itself is two renames.
_INCOMING: Final = ".previous.incoming"
_OUTGOING: Final = ".previous.outgoing"


@dataclass
class OutClaim:
    """This run's hold on ``--out``: released when the process exits (or on ``release``)."""

    path: Path
    run_id: str
    lock: IO[str]
    #: Whether :meth:`take_over` ran (it runs once).
    taken: bool = False

    def take_over(self) -> None:
        """This run has cells to run: keep the last run's evidence as ``previous/`` and
        clear the folder for this run's (:func:`keep_previous`). Once per claim."""
        if not self.taken:
            self.taken = True
            keep_previous(self.path)

    def release(self) -> None:
        self.lock.close()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def keep_previous(path: Path) -> None:
    """Move the outputs of the run that last wrote ``path`` into ``path/previous/``
    (replacing it) and leave ``path`` without outputs (``durations.json`` stays, copied).

    Leftovers of a run that wrote no report (killed) replace ``previous/`` only when there
    is none: evidence with a report is never traded for less. Every move is a rename in
    one file system; ``previous/`` is swapped in by two renames.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> _ = (out / RESULTS).write_text("[]"); keep_previous(out)
    >>> sorted(p.name for p in out.iterdir()), (out / PREVIOUS / RESULTS).read_text()
    (['previous'], '[]')
    >>> (out / "cells").mkdir(); keep_previous(out)  # a killed run's leftovers: dropped
    >>> sorted(p.name for p in out.iterdir()), (out / PREVIOUS / RESULTS).exists()
    (['previous'], True)
    """
    present = [name for name in OUTPUTS if os.path.lexists(path / name)]
    finished = (path / REPORT_XML).exists() or (path / RESULTS).exists()
    if not present or not (finished or not (path / PREVIOUS).exists()):
        for name in present:
            _remove(path / name)
        return
    incoming, outgoing = path / _INCOMING, path / _OUTGOING
    _remove(incoming)
    _remove(outgoing)
    incoming.mkdir()
    for name in present:
        os.rename(path / name, incoming / name)
    if (path / DURATIONS).is_file():
        shutil.copy2(path / DURATIONS, incoming / DURATIONS)
    if (path / PREVIOUS).exists():
        os.rename(path / PREVIOUS, outgoing)
    os.rename(incoming, path / PREVIOUS)
    _remove(outgoing)


def claim_out(path: Path) -> OutClaim:
    """Claim ``path`` for this run, or raise :class:`UsageError` (exit 2) saying why not."""
    path = path.resolve()
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path}: exists and is not a folder")
    if path.is_dir() and not (path / MARKER).exists():
        entries = sorted(p.name for p in path.iterdir())
        if entries:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            older = (" (if it is the output of a cpmatrix older than the marker, delete it "
                     "once by hand)" if REPORT_XML in entries else "")
            raise UsageError(
                f"--out {path}: not a cpmatrix output folder (no {MARKER} marker) and not "
                f"empty ({shown}); a run only ever deletes files it wrote itself: choose a "
                f"new or empty folder{older}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = open(path / LOCK, "a+", encoding="utf-8")  # noqa: SIM115 - held for the run
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot use it: {exc}") from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "{}"
        lock.close()
        try:
            info = json.loads(holder)
            who = (f"run {info.get('run_id', '?')} (pid {info.get('pid', '?')} on "
                   f"{info.get('host', '?')}, started {info.get('started', '?')})")
        except ValueError:
            who = "another run"
        raise UsageError(f"--out {path}: in use by {who}; wait for it or choose another "
                         "folder") from None
    run_id = secrets.token_hex(6)
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps({
        "run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }))
    lock.flush()
    (path / MARKER).touch()
    return OutClaim(path=path, run_id=run_id, lock=lock)
