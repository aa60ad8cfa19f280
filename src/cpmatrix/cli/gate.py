"""``cpmatrix gate``: decide a release from a merged report, and say why.

Example::

    $ cpmatrix gate --policy release --report out/parity-cpu/report.xml --baseline old.xml
    $ cpmatrix gate                    # policy, gates and out from [tool.cpmatrix]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cpmatrix.cli.common import add_command
from cpmatrix.cli.json_out import emit, gate_doc
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.layout import REPORT_XML
from cpmatrix.report.read import ReportError

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    g = add_command(
        sub, "gate", "decide a release from a report (a policy of the gates file)",
        "Decide from a report whether a policy of the gates file holds: every required "
        "cell present, run from the sources the matrix gives it now, passed; spills within "
        "budget; mutants killed; no drift past the baseline. Exit 0 pass, 1 fail (a "
        "table of reasons), 2 a malformed gates file or report.",
        ["cpmatrix gate", f"cpmatrix gate --policy release --report out/{REPORT_XML}",
         f"cpmatrix gate --baseline last/{REPORT_XML}      # also numerical drift",
         "cpmatrix gate --json"])
    g.add_argument("--policy", required=True,
                   help="a policy name in the gates file (default: policy in "
                   "[tool.cpmatrix])")
    g.add_argument("--report", type=Path, default=Path("out", REPORT_XML),
                   help="a merged report.xml (default: report.xml in out of "
                   "[tool.cpmatrix], else %(default)s)")
    g.add_argument("--baseline", type=Path, default=None,
                   help="an earlier report.xml: flag cells whose error grew (numerical drift)")
    g.add_argument("--gates", type=Path, default=None,
                   help="the policies file (default: gates in [tool.cpmatrix])")
    g.add_argument("--matrix", dest="matrices", action="append", default=[], type=Path,
                   metavar="PATH",
                   help="a matrix file (repeatable) whose cells must be present and must have "
                   "run from the sources it gives them now; a cell run from other sources is "
                   "'stale' (default: the policy's matrix: files)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON document (docs/cli-json.md) instead of the table")
    g.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from cpmatrix.gate import decide, format_gate

    if args.gates is None:
        raise UsageError("no gates file: give --gates FILE, or set gates = \"FILE\" in "
                         "[tool.cpmatrix] of your pyproject.toml")
    try:
        result = decide(args.policy, args.report, args.baseline, args.gates,
                        [p.resolve() for p in args.matrices])
    except ReportError as exc:  # exit 2 as every usage error (and its --json document)
        raise UsageError(str(exc)) from None
    code = ExitCode.OK if result.ok else ExitCode.FAILURES
    if args.json:
        emit(gate_doc(code, result, []))
    else:
        print(format_gate(result))
    return int(code)
