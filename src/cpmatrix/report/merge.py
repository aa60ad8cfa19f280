"""Shards of one run merged into one report: each cell once, a missing cell reported.

``cpmatrix run --shard K/N`` writes, beside its report, a :class:`ShardManifest`
(``shard.json``): which shard it was, the digest of the whole selection, every cell of
the whole selection and the cells of this shard. :func:`merge_shards` reads the shards'
folders and writes one ``report.xml``, ``results.json`` and ``durations.json``:

- each cell once: the first folder (in the order given) that holds a result for a cell
  wins; a cell reported twice is named in ``duplicates`` (shards of one selection never
  overlap, so this means a folder was given twice or came from another run);
- a cell that some manifest expects and no folder reports (a shard job that died
  before writing, an artifact that was never uploaded) becomes a result of status
  ``interrupted`` saying which shard should have run it: never silently dropped, and
  no gate policy can allow it;
- folders of different selections (another matrix, another N) are refused (exit 2).

Example::

    $ cpmatrix merge out/shard-1 out/shard-2 --out out/merged
    $ cpmatrix gate --policy release --report out/merged/report.xml
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from junitparser import JUnitXml, TestSuite

from cpmatrix.errors import UsageError
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.report.junit import results_to_junit, write_suites
from cpmatrix.result import Result, Status, testcase_name

__all__ = ["SHARD_FILE", "MergeSummary", "ShardManifest", "merge_shards", "selection_digest"]

#: The manifest a sharded run writes into its ``--out``.
SHARD_FILE = "shard.json"


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
        atomic_write_json(out / SHARD_FILE, self.to_dict())


@dataclass(frozen=True, slots=True)
class MergeSummary:
    """What a merge found: cells written, the ones no shard had, the ones seen twice."""

    cells: int
    missing: tuple[str, ...]
    duplicates: tuple[str, ...]
    warnings: tuple[str, ...]


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _manifest(folder: Path) -> ShardManifest | None:
    path = folder / SHARD_FILE
    if not path.exists():
        return None
    try:
        return ShardManifest.from_dict(_read_json(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not a shard manifest ({exc})") from None


def merge_shards(folders: Sequence[Path], out: Path) -> MergeSummary:
    """Merge the runs in ``folders`` into ``out`` (see the module docstring)."""
    if not folders:
        raise UsageError("merge needs at least one folder")
    warnings: list[str] = []
    manifests: list[tuple[Path, ShardManifest]] = []
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"{folder}: no such folder")
        m = _manifest(folder)
        if m is not None:
            manifests.append((folder, m))
    kinds = {(m.selection, m.of) for _, m in manifests}
    if len(kinds) > 1:
        listing = ", ".join(f"{f} (shard {m.shard}/{m.of} of selection {m.selection})"
                            for f, m in manifests)
        raise UsageError(f"these folders hold shards of different selections: {listing}")
    results: dict[str, Result] = {}
    cases: dict[str, Any] = {}
    suite_of: dict[str, str] = {}
    duplicates: list[str] = []
    # Every shard's recorded durations (its history included): the next sharding needs
    # them all, so the merged folder can seed the next release's shards.
    durations: dict[str, float] = {}
    for folder in folders:
        try:
            recorded = _read_json(folder / "durations.json")
            durations.update({str(k): float(v) for k, v in recorded.items()})
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        rows, xml = _read_folder(folder, warnings)
        by_name = {case.name: (suite.name, case) for suite in xml for case in suite}
        for r in rows:
            name = testcase_name(r.cell_id, r.mutant)
            if name in results:
                duplicates.append(name)
                continue
            results[name] = r
            if name in by_name:
                suite_of[name], cases[name] = by_name[name]
    expected = dict.fromkeys(c for _, m in manifests for c in m.all_cells)
    seen_cells = {r.cell_id for r in results.values()}
    missing = tuple(c for c in expected if c not in seen_cells)
    first = manifests[0][1] if manifests else None
    missing_results = [Result(
        cell_id=c, status=Status.INTERRUPTED,
        message=f"missing: no merged folder reported this cell (it belongs to shard "
        f"{first.owner(c)}/{first.of})" if first is not None else "") for c in missing]
    _write(out, results, cases, suite_of, missing_results, durations)
    return MergeSummary(cells=len(results) + len(missing), missing=missing,
                        duplicates=tuple(duplicates), warnings=tuple(warnings))


def _read_folder(folder: Path, warnings: list[str]) -> tuple[list[Result], JUnitXml]:
    """One run's results and report; a folder without them adds nothing (and a warning)."""
    try:
        rows = [Result.from_dict(d) for d in _read_json(folder / "results.json")]
    except FileNotFoundError:
        warnings.append(f"{folder}: no results.json (did that run finish?); its cells "
                        "count as missing")
        return [], JUnitXml()
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{folder / 'results.json'}: unreadable ({exc})") from None
    try:
        xml = JUnitXml.fromfile(os.fspath(folder / "report.xml"))
    except (OSError, SyntaxError) as exc:
        warnings.append(f"{folder}: report.xml unreadable ({exc}); its cells are "
                        "rewritten from results.json")
        xml = JUnitXml()
    return rows, xml


def _write(out: Path, results: dict[str, Result], cases: dict[str, Any],
           suite_of: dict[str, str], missing: list[Result],
           durations: dict[str, float]) -> None:
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
    write_suites(suites, out / "report.xml", run_id="merged")
    ordered = [*results.values(), *missing]
    atomic_write_json(out / "results.json", [r.to_dict() for r in ordered])
    atomic_write_json(out / "durations.json", {**durations, **{
        r.cell_id: round(r.duration_s, 4) for r in ordered
        if r.status is Status.PASSED and not r.mutant}})
