"""``cpmatrix gate`` and ``cpmatrix report``: decisions and views from a merged report.

Example::

    $ cpmatrix gate --policy release --report out/parity-cpu/report.xml --baseline old.xml
    $ cpmatrix report --report out/parity-cpu/report.xml      # -> out/parity-cpu/report.html
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpmatrix.errors import ExitCode

__all__ = ["add_report_parsers", "cmd_gate", "cmd_report"]


def add_report_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("gate", help="decide a release from a merged report (matrix/gates.yaml)")
    g.add_argument("--policy", required=True, help="a policy name in the gates file")
    g.add_argument("--report", required=True, type=Path, help="a merged report.xml")
    g.add_argument("--baseline", type=Path, default=None,
                   help="an earlier report.xml: flag cells whose error grew (numerical drift)")
    g.add_argument("--gates", type=Path, default=Path("matrix/gates.yaml"),
                   help="the policies file (default: %(default)s)")
    r = sub.add_parser("report", help="render a merged report.xml as one self-contained HTML page")
    r.add_argument("--report", type=Path, default=Path("out/parity-cpu/report.xml"),
                   help="a merged report.xml, or the run's output folder (default: %(default)s)")
    r.add_argument("--out", type=Path, default=None,
                   help="the HTML file (default: report.html beside the report)")


def cmd_gate(args: argparse.Namespace) -> int:
    from cpmatrix.gate import gate_main

    return gate_main(args.policy, args.report, args.baseline, args.gates)


def cmd_report(args: argparse.Namespace) -> int:
    from cpmatrix.gate import ReportError
    from cpmatrix.report.html import write_html

    report: Path = args.report
    if report.is_dir():
        report = report / "report.xml"
    out = args.out or report.with_name("report.html")
    try:
        write_html(report, out)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print(f"html: {out}")
    return ExitCode.OK
