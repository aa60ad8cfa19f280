"""``cpmatrix report``: a merged report.xml as one self-contained HTML page.

Example::

    $ cpmatrix report --report out/parity-cpu      # -> out/parity-cpu/report.html
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpmatrix.errors import ExitCode
from cpmatrix.layout import REPORT_HTML, REPORT_XML

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("report", help="render a merged report.xml as one self-contained HTML page")
    r.add_argument("--report", type=Path, default=Path("out/parity-cpu", REPORT_XML),
                   help="a merged report.xml, or the run's output folder (default: %(default)s)")
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
