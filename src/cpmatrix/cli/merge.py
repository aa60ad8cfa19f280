"""``cpmatrix merge``: the reports of a run's shards as one report, ready for the gate.

Exit 0 when every merged cell passed, 1 when some did not (a cell no shard reported
counts as not passed, a cell two folders disagree about fails), 2 for folders that cannot
be merged (missing, another selection, different sources, results without a source).

Example::

    $ cpmatrix merge shards/1 shards/2 shards/3 --out merged
    $ cpmatrix gate --policy release --report merged/report.xml --baseline last/report.xml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpmatrix.cli.common import add_command
from cpmatrix.cli.json_out import emit, merge_doc
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.layout import RunLayout
from cpmatrix.result import read_results

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    m = add_command(
        sub, "merge", "merge the --out folders of sharded runs into one report",
        "Merge the output folders of a run's shards into one report (report.xml, "
        "results.json, report.html, durations.json): each cell once; a cell no shard "
        "reported is missing, one two folders disagree about fails. Folders run from "
        "different sources are refused (exit 2).",
        ["cpmatrix merge out/shard-* --out out/merged",
         "cpmatrix merge out/shard-* --out out/merged --json"])
    m.add_argument("folders", nargs="+", type=Path, metavar="DIR",
                   help="a shard's --out folder (each holds report.xml, results.json)")
    m.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="where the merged report.xml, results.json and report.html go")
    m.add_argument("--json", action="store_true",
                   help="print one JSON document (docs/cli-json.md); the lines go to stderr")
    m.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from cpmatrix.report.html import write_report_html
    from cpmatrix.report.merge import merge_shards
    from cpmatrix.supervise.outdir import claim_out

    out: Path = args.out.resolve()
    said: list[str] = []
    stream = sys.stderr if args.json else sys.stdout

    if out in {f.resolve() for f in args.folders}:
        raise UsageError("--out must be a new folder, not one of the shards")
    claim = claim_out(out)  # a usage or spec error is main's to report (and its document)
    try:
        claim.take_over()
        summary = merge_shards(list(args.folders), out)
        write_report_html(out)
    finally:
        claim.release()

    def say(line: str) -> None:
        said.append(line)
        print(line, file=sys.stderr)

    for warning in summary.warnings:
        say(f"warning: {warning}")
    if summary.duplicates:
        say(f"warning: {len(summary.duplicates)} cells were reported by more than one "
            "folder, with the same verdict: " + ", ".join(summary.duplicates[:10]))
    if summary.conflicts:
        say(f"error: {len(summary.conflicts)} cells were reported by more than one folder "
            "with different verdicts; they fail the merge (conflict):\n  "
            + "\n  ".join(summary.conflicts[:50]))
    if summary.missing:
        say(f"error: {len(summary.missing)} cells were reported by no folder; they are "
            "in the report as interrupted:\n  " + "\n  ".join(summary.missing[:50]))
    bad = sum(1 for r in read_results(RunLayout(out).results) if not r.status.ok)
    print(f"merged {summary.cells} cells from {len(args.folders)} folders into {out} "
          f"({bad} not passed, {len(summary.missing)} missing, "
          f"{len(summary.conflicts)} conflicts)", file=stream)
    code = ExitCode.OK if bad == 0 else ExitCode.FAILURES
    if args.json:
        emit(merge_doc(code, out, args.folders, summary, bad, said))
    return code
