"""The result cache of one run: the local folder in front, a remote cache behind it.

Read local, then remote; write both (docs/cache.md, "Remote cache"):

- **lookup**: a cell the local folder has no usable entry for is asked of the remote
  (``/ac/<pre-key>``, concurrently; all of them within one deadline, past which the
  remote goes off and the rest are misses). A remote entry is the local entry's JSON, stored as
  the action's one output (:data:`ENTRY_PATH`); its blob is verified against its digest
  by :class:`~cpmatrix.cache.http.RemoteCache`, then the entry is checked *exactly
  as a local one* (:meth:`~cpmatrix.cache.key.ResultCache.check`: format, key, cell, a
  pass, and every file of its observed set re-hashed here). Only then is it a hit: it
  is written to the local folder and reported ``cached``, its message and evidence
  naming the remote. Anything else is a miss, counted and noted.
- **store**: a new pass becomes an entry by :meth:`~cpmatrix.cache.key.ResultCache.entry`
  (the one rule, :func:`~cpmatrix.cache.key.storable`: a first-attempt pass of an
  unmutated cell), written locally, then uploaded in the background unless read-only.
  The remote gets exactly the bytes the local folder would hold, never anything else.
- **finish**: waits for the uploads (at most one deadline, then they are cut) and says
  what the remote did (printed, and recorded in ``run.json`` under ``"cache"``).
- **logs**: an entry carries what each rank of the pass printed (``logs``: rank -> text,
  the cell's ``rank<r>/output.log``, at most 64 KiB each); after the run (``finish``) a
  hit's, local or remote, are put back in the cell's folder under a first line naming
  the stored run (not at lookup: the lookup runs before the last run's cell folders
  move to ``previous/``). Evidence
  only: :meth:`~cpmatrix.cache.key.ResultCache.check` never reads them, and a remote
  entry's bytes, logs included, are verified against its digest before use.

Which remote (:func:`remote_settings`): ``--remote-cache URL`` wins over the matrix's
``remote_cache:`` setting; ``--remote-cache ""`` turns the setting off; ``--no-cache``
turns both caches off. ``--remote-cache-read-only`` makes either read-only, and is a
no-op with no remote (so one CI line serves projects with and without one).

Example::

    layers = CacheLayers(ResultCache(root), RemoteCache(settings), keys)   # doctest: +SKIP
    hits = layers.lookup(cells)                                             # doctest: +SKIP
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from cpmatrix.cache.http import RemoteCache, RemoteSettings
from cpmatrix.cache.key import ResultCache
from cpmatrix.cache.settings import CacheSettings
from cpmatrix.errors import SpecError, UsageError
from cpmatrix.fsutil import atomic_write_json, atomic_write_text, read_json, read_segment
from cpmatrix.layout import RunLayout, cell_output_log, cell_output_logs
from cpmatrix.matrix.schema import Cell, Matrix
from cpmatrix.result import Result

__all__ = ["ENTRY_PATH", "CacheLayers", "remote_settings"]

#: The path of a cell's entry among its action's output files.
ENTRY_PATH = "cpmatrix/entry.json"
#: Remote lookups in flight at once (each thread keeps one connection).
_LOOKUPS = 8
#: Uploads in flight at once, in the background of the run.
_UPLOADS = 4
#: A rank's log stored with a pass, at most (its last bytes).
_LOG_CAP = 1 << 16
#: Notes (entries that failed verification or read other files) printed at most.
_NOTES_SHOWN = 5


def remote_settings(options: CacheSettings, matrix: Matrix) -> RemoteSettings | None:
    """The run's remote cache: ``--remote-cache`` over the matrix's ``remote_cache:``;
    None with ``--no-cache``, ``--remote-cache ""`` or neither. UsageError / SpecError
    (exit 2, naming the flag or ``file:line:column``) for a bad URL."""
    if options.no_cache:
        return None
    read_only = options.remote_cache_read_only
    if options.remote_cache is not None:  # the command line wins
        if not options.remote_cache.strip():
            return None
        return RemoteSettings.parse(options.remote_cache, read_only=read_only)
    setting = matrix.remote_cache
    if setting is None:  # --remote-cache-read-only alone: nothing to write to anyway
        return None
    try:
        return RemoteSettings.parse(setting.url, read_only=read_only or setting.read_only,
                                    option="remote_cache")
    except UsageError as exc:
        raise SpecError(setting.file, setting.line, setting.column, "remote_cache",
                        str(exc).removeprefix("remote_cache: "),
                        "http(s)://host[:port][/prefix], credentials in "
                        "$CPMATRIX_REMOTE_CACHE_TOKEN or a netrc file") from None


class CacheLayers:
    """The local cache and an optional remote one, for the cells of one run.

    ``keys``: cell id -> pre-key (the action key, the same on every machine); ``out``:
    the run's output folder, whose cell folders the logs are read from and put back to
    (None: no logs).
    """

    def __init__(self, local: ResultCache, remote: RemoteCache | None,
                 keys: Mapping[str, str], out: Path | None = None) -> None:
        self.local = local
        self.remote = remote
        self.keys = dict(keys)
        self.out = out
        #: Cell folder -> (stored at, rank -> log) of each hit, written by :meth:`finish`.
        self._hit_logs: dict[str, tuple[str, dict[int, str]]] = {}
        self.local_hits = 0
        self.remote_hits = 0
        self._uploads: ThreadPoolExecutor | None = None
        self._pending: list[Future[bool]] = []
        self._finished = False

    # ---------------------------------------------------------------- lookup
    def lookup(self, cells: Sequence[Cell]) -> dict[str, Result]:
        """Cached passes of ``cells``, by cell id (local first, then remote)."""
        hits: dict[str, Result] = {}
        for c in cells:
            entry = self.local.read(self.keys[c.id])  # read once: checked, then its logs
            hit = None if entry is None else self.local.check(entry, self.keys[c.id], c.id)
            if isinstance(hit, Result):
                hits[c.id] = hit
                self._restore_logs(hit, entry)
        self.local_hits = len(hits)
        remote = self.remote
        missing = [c for c in cells if c.id not in hits]
        if remote is None or not missing:
            return hits
        with ThreadPoolExecutor(max_workers=min(_LOOKUPS, len(missing))) as pool:
            asked = [pool.submit(remote.get_action, self.keys[c.id]) for c in missing]
            # All the lookups get one deadline: past it the remote goes off, which ends
            # those in flight and answers the rest at once (misses).
            remote.wait(asked, "the lookups")
        found = [f.result() for f in asked]
        for c, outputs in zip(missing, found, strict=True):
            if outputs is not None:
                hit = self._adopt(remote, c, outputs)
                if hit is not None:
                    hits[c.id] = hit
                    self.remote_hits += 1
        return hits

    def _adopt(self, remote: RemoteCache, cell: Cell, outputs: Mapping[str, bytes],
               ) -> Result | None:
        """A remote entry checked as a local one; written locally when it holds here."""
        key = self.keys[cell.id]
        try:
            entry = json.loads(outputs[ENTRY_PATH].decode("utf-8"))
        except (KeyError, UnicodeDecodeError, ValueError):
            remote.reject(key, f"{cell.id}: the entry is not a cpmatrix entry")
            return None
        found = self.local.check(entry, key, cell.id)
        if isinstance(found, str):
            remote.reject(key, f"{cell.id}: {found}")
            return None
        try:
            self.local.write(key, entry)
        except OSError as exc:  # a full or read-only local cache must not fail the run
            print(f"warning: could not store {cell.id} in the local cache: {exc}",
                  file=sys.stderr)
        self._restore_logs(found, entry)
        url = remote.settings.display
        return replace(found, message=f"{found.message} (remote cache {url})",
                       evidence={**found.evidence, "cached_from": url})

    # ------------------------------------------------------------------ logs
    def _logs(self, result: Result) -> dict[str, str]:
        """What each rank of a fresh pass printed (its cell folder's output logs)."""
        if self.out is None:
            return {}
        return {str(rank): read_segment(log, cap=_LOG_CAP)
                for rank, log in cell_output_logs(self.out / result.out_dir).items()}

    def _restore_logs(self, hit: Result, entry: object) -> None:
        """Keep a hit's logs for :meth:`finish` (a damaged one is left out: the pass was
        checked without it)."""
        if not isinstance(entry, dict) or not isinstance(entry.get("logs"), dict):
            return
        logs = {int(r): t for r, t in entry["logs"].items()
                if isinstance(r, str) and r.isdigit() and isinstance(t, str)}
        self._hit_logs[hit.out_dir] = (str(entry.get("stored_at", "?")), logs)

    def _write_hit_logs(self) -> None:
        """Put each hit's logs back in its cell folder, marked as the stored run's."""
        if self.out is None:
            return
        for out_dir, (at, logs) in self._hit_logs.items():
            head = f"[cpmatrix: cached; the output of the run that stored this pass at {at}]\n"
            for rank, text in logs.items():
                try:
                    atomic_write_text(self.out / cell_output_log(out_dir, rank), head + text)
                except OSError:
                    return  # evidence only: a cached pass is not failed for its log
        self._hit_logs.clear()

    # ----------------------------------------------------------------- store
    def store(self, cell: Cell, result: Result, reads: Mapping[str, str]) -> None:
        """Store a pass with the hashes of what it read: locally, then remotely."""
        key = self.keys[cell.id]
        entry = self.local.entry(key, result, reads)
        if entry is None:  # not a first-attempt pass of an unmutated cell
            return
        entry["logs"] = self._logs(result)
        try:
            self.local.write(key, entry)
        except OSError as exc:  # a full or read-only cache must not fail the run
            print(f"warning: could not store {cell.id} in the cache: {exc}", file=sys.stderr)
        remote = self.remote
        if remote is None or remote.settings.read_only or self._finished:
            return
        data = json.dumps(entry, sort_keys=True).encode()
        if self._uploads is None:
            self._uploads = ThreadPoolExecutor(max_workers=_UPLOADS,
                                               thread_name_prefix="cpmatrix-upload")
        self._pending.append(self._uploads.submit(remote.put_action, key, {ENTRY_PATH: data}))

    # ---------------------------------------------------------------- finish
    def finish(self) -> list[str]:
        """Put the hits' logs back, wait for the uploads, close the connections; lines
        saying what the remote did (none without a remote). Idempotent."""
        self._write_hit_logs()
        if self._finished or self.remote is None:
            self._finished = True
            return []
        self._finished = True
        t0 = time.monotonic()
        if self._uploads is not None:
            # One deadline for what is left of the uploads; past it they are cut.
            self.remote.wait(self._pending, "the uploads")
            self._uploads.shutdown(wait=True)
        self.remote.close()
        stats = self.remote.stats
        mode = " (read-only)" if self.remote.settings.read_only else ""
        lines = [f"remote cache {self.remote.settings.display}{mode}: {stats.summary()}"
                 + (f" (uploads finished {time.monotonic() - t0:.2f} s after the run)"
                    if self._pending else "")]
        for note in stats.notes[:_NOTES_SHOWN]:
            lines.append(f"  miss: {note}")
        if len(stats.notes) > _NOTES_SHOWN:
            lines.append(f"  ... and {len(stats.notes) - _NOTES_SHOWN} more (run.json)")
        return lines

    def record(self, out: Path) -> None:
        """Add what the caches did to ``out/run.json`` (after :meth:`finish`)."""
        try:
            run = read_json(RunLayout(out).run_info)
        except (OSError, ValueError):
            return
        if not isinstance(run, dict):
            return
        cache: dict[str, object] = {"local_hits": self.local_hits,
                                    "remote_hits": self.remote_hits}
        if self.remote is not None:
            cache["remote"] = {"url": self.remote.settings.display,
                               "read_only": self.remote.settings.read_only,
                               **asdict(self.remote.stats)}
        run["cache"] = cache
        atomic_write_json(RunLayout(out).run_info, run)
