"""``cpmatrix gate``: decide a release from a merged report, and say why.

Example::

    $ cpmatrix gate --policy release --report out/parity-cpu/report.xml --baseline old.xml
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("gate", help="decide a release from a merged report (matrix/gates.yaml)")
    g.add_argument("--policy", required=True, help="a policy name in the gates file")
    g.add_argument("--report", required=True, type=Path, help="a merged report.xml")
    g.add_argument("--baseline", type=Path, default=None,
                   help="an earlier report.xml: flag cells whose error grew (numerical drift)")
    g.add_argument("--gates", type=Path, default=Path("matrix/gates.yaml"),
                   help="the policies file (default: %(default)s)")
    g.add_argument("--matrix", dest="matrices", action="append", default=[], type=Path,
                   metavar="PATH",
                   help="a matrix file (repeatable) whose cells must be present and must have "
                   "run from the sources it gives them now; a cell run from other sources is "
                   "'stale' (default: the policy's matrix: files)")
    g.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from cpmatrix.gate import gate_main

    return gate_main(args.policy, args.report, args.baseline, args.gates,
                     [p.resolve() for p in args.matrices])
