"""``cpmatrix run`` and ``cpmatrix spill``: select, run, report; exit 0/1/2/3/4/128+N.

Example::

    $ cpmatrix run --matrix matrix/parity.yaml --platform cpu -k ring --out out
    $ cpmatrix spill --matrix matrix/parity.yaml -k arch=sm_90a
"""

from __future__ import annotations

import argparse
from functools import partial

from cpmatrix.cli.common import add_selection, nothing_selected, select_from_args
from cpmatrix.cli.console import Console
from cpmatrix.run.options import RunOptions, add_run_arguments
from cpmatrix.run.pipeline import Chosen, execute

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run the selected cells in batched torchrun worlds")
    add_selection(p)
    p.set_defaults(platform="cpu", only_kind=None, handler=run)
    add_run_arguments(p)
    s = sub.add_parser("spill", help="run only the Triton register-spill gates (kind: spill)")
    add_selection(s)
    s.set_defaults(platform=None, only_kind="spill", handler=run)
    add_run_arguments(s, exclude=("mutants",))


def run(args: argparse.Namespace) -> int:
    """Parse, hand the run to the pipeline (which claims ``--out`` before selecting),
    print what it says."""
    options = RunOptions.from_namespace(args)
    return execute(options, partial(_choose, args), Console(plain=options.plain))


def _choose(args: argparse.Namespace) -> Chosen:
    """The selection ``args`` make (``spill``: its kind only), or why none."""
    matrix, expansion, cells = select_from_args(args)
    if args.only_kind:
        cells = [c for c in cells if c.kind == args.only_kind]
    return Chosen(matrix=matrix, cells=cells,
                  nothing=nothing_selected(args, len(expansion.cells)) if not cells else "")
