"""``cpmatrix report``: a merged report.xml as one self-contained HTML page.

Example::

    $ cpmatrix report --report out/parity-cpu      # -> out/parity-cpu/report.html
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpmatrix.cli.common import add_command
from cpmatrix.errors import ExitCode
from cpmatrix.layout import REPORT_HTML, REPORT_XML

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = add_command(
        sub, "report", "render a report.xml as one self-contained HTML page",
        "Render a run's (or merge's) report.xml as one HTML page with no outside assets: "
        "totals, failures with their repro line, the grid, timings per cell and world, "
        "and duration and flake plots from the folder's durations.json.",
        ["cpmatrix report", "cpmatrix report --report out/merged --out merged.html"])
    r.add_argument("--report", type=Path, default=Path("out"),
                   help="a report.xml, or the run's output folder (default: out of "
                   "[tool.cpmatrix], else %(default)s)")
    r.add_argument("--out", type=Path, default=None,
                   help="the HTML file (default: report.html beside the report)")
    r.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from cpmatrix.report import ReportError
    from cpmatrix.report.html import write_html

    report: Path = args.report
    if report.is_dir():
        report = report / REPORT_XML
    out = args.out or report.with_name(REPORT_HTML)
    try:
        write_html(report, out)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print(f"html: {out}")
    return ExitCode.OK
