"""Shards of one run merged into one report: each cell once, from one source, a missing
cell reported.

``cpmatrix run --shard K/N`` writes, beside its report, a :class:`ShardManifest`
(``shard.json``): which shard it was, the digest of the whole selection, every cell of
the whole selection and the cells of this shard. Every run also records its source
(``run.json``: the source digest of every cell of the selection, the matrix digest,
cpmatrix's version, the git commit; each result carries its own, see
:mod:`cpmatrix.cache.provenance`). :func:`merge_shards` reads the folders and writes one
``report.xml``, ``results.json``, ``durations.json`` and ``run.json``:

- **one source**: folders that give one cell different source digests (yesterday's
  shard 1 and today's shard 2; another cpmatrix) are refused (exit 2), naming the cells;
  a folder whose results carry no source (an older cpmatrix, a hand-made report) too.
  Folders that agree on every cell but differ in matrix file or commit (a comment, a
  README commit between the shard jobs) merge with a warning;
- **each cell once**: a cell two folders report with the same verdict is merged once
  (named in ``duplicates``); two results for one cell that disagree (one passed, one
  failed) are a **conflict**: the merged result fails, naming both folders and what
  each said (never first-wins: an old passing shard must not hide today's failure).
  ``interrupted`` is no verdict: any other result of the cell takes its place;
- a cell that some manifest expects and no folder reports (a shard job that died
  before writing, an artifact that was never uploaded) becomes a result of status
  ``interrupted`` saying which shard should have run it: never silently dropped, and
  no gate policy can allow it;
- folders of different selections (another matrix, another N) are refused (exit 2).
- **histories** (``durations.json``, :mod:`cpmatrix.report.history`): each cell's kept
  runs united over the folders (a run several hold counts once), the last ones kept.

Example::

    $ cpmatrix merge out/shard-1 out/shard-2 --out out/merged
    $ cpmatrix gate --policy release --report out/merged/report.xml
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from junitparser import JUnitXml, TestSuite

from cpmatrix.errors import UsageError
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.layout import RunLayout
from cpmatrix.report.history import (
    CellHistory,
    load_run_history,
    merge_histories,
    save_run_history,
)
from cpmatrix.report.junit import results_to_junit, write_suites
from cpmatrix.result import FailureKind, RankFailure, Result, Status, read_results, testcase_name

__all__ = ["MergeSummary", "ShardManifest", "merge_shards", "selection_digest"]

def selection_digest(cell_ids: Iterable[str]) -> str:
    """Names the whole selection (order-free), so shards of different ones never mix.

    >>> selection_digest(["b", "a"]) == selection_digest(["a", "b", "a"])
    True
    """
    joined = "\n".join(sorted(set(cell_ids)))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ShardManifest:
    """What a sharded run was asked to run (``shard.json``).

    Each shard holds the whole partition, so a merge that lacks some shard's folder
    still knows which cells that shard owed.

    >>> m = ShardManifest(shard=2, of=2, selection=selection_digest(["a", "b"]),
    ...                   partition=(("a",), ("b",)))
    >>> ShardManifest.from_dict(m.to_dict()) == m, m.cells, m.owner("a")
    (True, ('b',), 1)
    """

    shard: int
    of: int
    selection: str
    #: Every shard's cells, shard 1 first.
    partition: tuple[tuple[str, ...], ...]

    @property
    def cells(self) -> tuple[str, ...]:
        """This shard's cells."""
        return self.partition[self.shard - 1]

    @property
    def all_cells(self) -> tuple[str, ...]:
        return tuple(c for part in self.partition for c in part)

    def owner(self, cell_id: str) -> int:
        """The shard (1-based) that runs ``cell_id``; 0 when none does."""
        return next((i for i, part in enumerate(self.partition, 1) if cell_id in part), 0)

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "of": self.of, "selection": self.selection,
                "partition": [list(p) for p in self.partition]}

    @classmethod
    def from_dict(cls, d: Any) -> ShardManifest:
        if not isinstance(d, dict):
            raise ValueError("not an object")
        partition = tuple(tuple(map(str, p)) for p in d["partition"])
        m = cls(shard=int(d["shard"]), of=int(d["of"]), selection=str(d["selection"]),
                partition=partition)
        if len(partition) != m.of or not 1 <= m.shard <= m.of:
            raise ValueError(f"shard {m.shard}/{m.of} with {len(partition)} parts")
        return m

    def write(self, out: Path) -> None:
        atomic_write_json(RunLayout(out).shard_manifest, self.to_dict())


@dataclass(frozen=True, slots=True)
class MergeSummary:
    """What a merge found: cells written, the ones no shard had, the ones seen twice with
    one verdict, the ones two folders disagree about."""

    cells: int
    missing: tuple[str, ...]
    duplicates: tuple[str, ...]
    warnings: tuple[str, ...]
    conflicts: tuple[str, ...] = ()


@dataclass
class _Folder:
    """One folder to merge, read once."""

    path: Path
    rows: list[Result]
    xml: JUnitXml
    manifest: ShardManifest | None
    #: The run's source (run.json); None when it recorded none.
    source: dict[str, Any] | None
    #: Cell id -> source digest, for every cell this folder vouches for.
    digests: dict[str, str]


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _manifest(folder: Path) -> ShardManifest | None:
    path = RunLayout(folder).shard_manifest
    if not path.exists():
        return None
    try:
        return ShardManifest.from_dict(_read_json(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not a shard manifest ({exc})") from None


def _run_source(folder: Path) -> dict[str, Any] | None:
    """``run.json``'s ``source`` (the run's identity and its cells' digests), if any."""
    try:
        source = _read_json(RunLayout(folder).run_info).get("source")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        raise UsageError(f"{RunLayout(folder).run_info}: unreadable ({exc})") from None
    return source if isinstance(source, dict) else None


def _read(folder: Path, warnings: list[str]) -> _Folder:
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder")
    manifest = _manifest(folder)
    rows, xml = _read_folder(folder, warnings)
    source = _run_source(folder)
    digests: dict[str, str] = {}
    cells = source.get("cells") if source is not None else None
    if isinstance(cells, dict):
        digests.update({str(k): str(v) for k, v in cells.items()})
    # An interrupted result says nothing ran (a merge's own "missing" rows too).
    unsourced = [r.cell_id for r in rows
                 if not r.source.get("digest") and r.status is not Status.INTERRUPTED]
    if unsourced:
        raise UsageError(
            f"{folder}: {len(unsourced)} results carry no source digest (e.g. "
            f"{unsourced[0]}): written by a cpmatrix older than source identities, or by "
            "hand; a merge cannot tell whether they ran from the same sources as the "
            "other folders: run those cells again")
    for r in rows:
        if not r.source.get("digest"):
            continue
        digests.setdefault(r.cell_id, r.source["digest"])
        if digests[r.cell_id] != r.source["digest"]:
            raise UsageError(f"{folder}: {r.cell_id}: results.json and run.json disagree "
                             "about its source digest (a folder assembled by hand?)")
    return _Folder(path=folder, rows=rows, xml=xml, manifest=manifest, source=source,
                   digests=digests)


def _check_sources(folders: Sequence[_Folder], warnings: list[str]) -> None:
    """Refuse folders that give a cell different source digests (naming the cells);
    warn about other differences of their runs' identities."""
    seen: dict[str, dict[str, list[Path]]] = {}
    for f in folders:
        for cell_id, digest in f.digests.items():
            seen.setdefault(cell_id, {}).setdefault(digest, []).append(f.path)
    differ = sorted(c for c, by in seen.items() if len(by) > 1)
    if differ:
        lines = [f"  {c}: " + "; ".join(f"{d[:12]} in {', '.join(map(str, paths))}"
                                       for d, paths in seen[c].items()) for c in differ[:20]]
        more = f"\n  ... and {len(differ) - 20} more" if len(differ) > 20 else ""
        raise UsageError(
            f"these folders ran different sources: {len(differ)} cells have different "
            "source digests (case code, its imports, the matrix entry or cpmatrix changed "
            "between the runs); run every shard from one source:\n" + "\n".join(lines) + more)
    for key, what in (("matrix", "matrix file"), ("commit", "git commit")):
        values = {str(f.source.get(key)) for f in folders if f.source is not None}
        if len(values) > 1:
            warnings.append(f"the folders' runs had different {what}s ({', '.join(sorted(values))}"
                            "); every cell's own source digest agrees, so they merge")


def _verdict(r: Result) -> str:
    """What a result says, for telling agreeing duplicates from conflicts."""
    return "passed" if r.status.ok else r.status.value


def _conflict(name: str, first: tuple[Path, Result], other: tuple[Path, Result]) -> Result:
    (path_a, a), (path_b, b) = first, other
    message = (f"conflict: {path_a} says {a.status.value}, {path_b} says {b.status.value}; "
               "two results for one cell that disagree fail the merge (run the cell again)")
    return Result(cell_id=a.cell_id, status=Status.FAILED, kind=FailureKind.ERROR,
                  failures=(RankFailure(rank=-1, message=message, check="merge_conflict"),),
                  message=message, mutant=a.mutant, source=dict(a.source),
                  evidence={f"{k}@{path_a.name}": v for k, v in a.evidence.items()})


def merge_shards(folders: Sequence[Path], out: Path) -> MergeSummary:
    """Merge the runs in ``folders`` into ``out`` (see the module docstring)."""
    if not folders:
        raise UsageError("merge needs at least one folder")
    warnings: list[str] = []
    read = [_read(folder, warnings) for folder in folders]
    manifests = [(f.path, f.manifest) for f in read if f.manifest is not None]
    kinds = {(m.selection, m.of) for _, m in manifests}
    if len(kinds) > 1:
        listing = ", ".join(f"{f} (shard {m.shard}/{m.of} of selection {m.selection})"
                            for f, m in manifests)
        raise UsageError(f"these folders hold shards of different selections: {listing}")
    _check_sources(read, warnings)
    results: dict[str, Result] = {}
    origin: dict[str, Path] = {}
    cases: dict[str, Any] = {}
    suite_of: dict[str, str] = {}
    duplicates: list[str] = []
    conflicts: list[str] = []
    # Every shard's recorded durations and runs (the baseline it started from included):
    # the next sharding needs them all, so the merged folder can seed the next release's
    # shards, and the flake history is the union of the shards' runs.
    history = merge_histories(load_run_history(f.path) for f in read)
    for f in read:
        by_name = {case.name: (suite.name, case) for suite in f.xml for case in suite}
        for r in f.rows:
            name = testcase_name(r.cell_id, r.mutant)
            if name in results and results[name].status is Status.INTERRUPTED:
                del results[name]  # no verdict (a stopped run, a shard found missing)
                cases.pop(name, None)
            if name in results:
                if r.status is Status.INTERRUPTED or name in conflicts:
                    continue
                if _verdict(results[name]) == _verdict(r):
                    duplicates.append(name)
                else:
                    conflicts.append(name)
                    results[name] = _conflict(name, (origin[name], results[name]), (f.path, r))
                    cases.pop(name, None)  # rewritten from the conflict result
                continue
            results[name] = r
            origin[name] = f.path
            if name in by_name:
                suite_of[name], cases[name] = by_name[name]
    expected = dict.fromkeys(c for _, m in manifests for c in m.all_cells)
    seen_cells = {r.cell_id for r in results.values()}
    missing = tuple(c for c in expected if c not in seen_cells)
    first = manifests[0][1] if manifests else None
    claimed = {c: d for f in read for c, d in f.digests.items()}
    missing_results = [Result(
        cell_id=c, status=Status.INTERRUPTED,
        message=f"missing: no merged folder reported this cell (it belongs to shard "
        f"{first.owner(c)}/{first.of})" if first is not None else "",
        source={"digest": claimed[c]} if c in claimed else {}) for c in missing]
    _write(out, results, cases, suite_of, missing_results, history)
    sources = [f for f in read if f.source is not None]
    atomic_write_json(RunLayout(out).run_info, {
        "run_id": "merged",
        "merged_from": [{"folder": str(f.path), "source": f.source} for f in read],
        "source": {**{k: v for k, v in (sources[0].source or {}).items() if k != "cells"},
                   "cells": claimed} if sources else None,
    })
    return MergeSummary(cells=len(results) + len(missing), missing=missing,
                        duplicates=tuple(duplicates), warnings=tuple(warnings),
                        conflicts=tuple(conflicts))


def _read_folder(folder: Path, warnings: list[str]) -> tuple[list[Result], JUnitXml]:
    """One run's results and report; a folder without them adds nothing (and a warning)."""
    try:
        rows = read_results(RunLayout(folder).results)
    except FileNotFoundError:
        warnings.append(f"{folder}: no results.json (did that run finish?); its cells "
                        "count as missing")
        return [], JUnitXml()
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{RunLayout(folder).results}: unreadable ({exc})") from None
    try:
        xml = JUnitXml.fromfile(os.fspath(RunLayout(folder).report_xml))
    except (OSError, SyntaxError) as exc:
        warnings.append(f"{folder}: report.xml unreadable ({exc}); its cells are "
                        "rewritten from results.json")
        xml = JUnitXml()
    return rows, xml


def _write(out: Path, results: dict[str, Result], cases: dict[str, Any],
           suite_of: dict[str, str], missing: list[Result],
           history: dict[str, CellHistory]) -> None:
    """report.xml (the shards' own testcases, evidence and all), results.json, durations."""
    out.mkdir(parents=True, exist_ok=True)
    suites: dict[str, TestSuite] = {}

    def add(target: str, case: Any) -> None:
        if target not in suites:
            suites[target] = TestSuite(target)
        suites[target].add_testcase(case)

    # A cell the shard's report lacks is rewritten from its result (without the
    # matrix's cell properties, which only the run that had the matrix knows).
    rebuilt = [r for name, r in results.items() if name not in cases] + missing
    for name, case in cases.items():
        add(case.classname or suite_of[name], case)
    for suite in results_to_junit(rebuilt, {}):
        for case in suite:
            add(case.classname or suite.name, case)
    write_suites(suites, RunLayout(out).report_xml, run_id="merged")
    ordered = [*results.values(), *missing]
    atomic_write_json(RunLayout(out).results, [r.to_dict() for r in ordered])
    # The runs are the shards' (already in their histories); a passing result's seconds
    # are the cell's duration all the same (a shard whose durations.json was lost).
    for r in ordered:
        if r.status is Status.PASSED and not r.mutant:
            old = history.get(r.cell_id, CellHistory())
            history[r.cell_id] = replace(old, duration_s=round(r.duration_s, 4))
    save_run_history(out, history)
