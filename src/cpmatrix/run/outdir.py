"""The run's output folder: claimed by one run at a time, emptied only of our own files.

``claim(out)`` is the first thing ``cpmatrix run`` does with ``--out``:

- **Ownership.** A folder cpmatrix made holds the marker ``.cpmatrix-out``. An existing
  folder without it that holds anything is refused (exit 2): a run never deletes a
  user's files. An empty or new folder is adopted.
- **One run at a time.** An exclusive ``flock`` on ``.cpmatrix.lock`` is held until the
  process exits (the kernel drops it even on SIGKILL); a second run on the same folder
  exits 2 naming the run that holds it (pid, host, start time, run id).
- **No stale report.** The previous run's report files and its ``worlds/``, ``cells/``
  and ``spill/`` folders are deleted before anything else happens, so a report in the
  folder is always this run's (or absent), whatever happens to this run.
  ``durations.json`` (timing history for the planner) is kept.

Example::

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> claim = claim_out(out)
    >>> (out / MARKER).exists(), len(claim.run_id)
    (True, 12)
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
from typing import IO

from cpmatrix.errors import UsageError
from cpmatrix.layout import LOCK, MARKER, OUTPUTS, REPORT_XML

__all__ = ["OutClaim", "claim_out"]



@dataclass
class OutClaim:
    """This run's hold on ``--out``: released when the process exits (or on ``release``)."""

    path: Path
    run_id: str
    lock: IO[str]

    def release(self) -> None:
        self.lock.close()


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
    for name in OUTPUTS:
        stale = path / name
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            try:
                stale.unlink()
            except FileNotFoundError:
                pass
    return OutClaim(path=path, run_id=run_id, lock=lock)
