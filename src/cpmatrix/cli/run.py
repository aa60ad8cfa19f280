"""``cpmatrix run`` and ``cpmatrix spill``: select, run, report; exit 0/1/2/3/4/128+N.

Example::

    $ cpmatrix run -k ring --out out
    $ cpmatrix run -x --failed-first --durations 5
    $ cpmatrix spill -k arch=sm_90a
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

from cpmatrix.cli.common import (
    add_command,
    add_selection,
    excluded_counts,
    keyword_hints,
    nothing_selected,
    select_from_args,
)
from cpmatrix.cli.console import Console
from cpmatrix.cli.json_out import emit, run_doc
from cpmatrix.kinds.executors import EXECUTORS
from cpmatrix.supervise.options import RunOptions, add_run_arguments
from cpmatrix.supervise.pipeline import Chosen, execute

__all__ = ["add_parsers", "add_reporting", "repro_flags", "run"]

_EXAMPLES = ("cpmatrix run", "cpmatrix run -k \"ring and 2x2\" --out out/ring",
             "cpmatrix run -x --failed-first            # stop at the first failure; "
             "last failures first",
             "cpmatrix run --durations 5                # list the 5 slowest cells",
             "cpmatrix run --shard 2/8 --durations-from FILE  # balanced by a run's records",
             "cpmatrix run --mutants                    # planted bugs must all be killed",
             "cpmatrix run --dry-run --platform cuda --gpus 8",
             "cpmatrix run --json > run.json            # one JSON document for CI tools")


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "run", "run the selected cells in persistent worlds (fork launcher by default)",
        "Run the selected cells, many per world: one world per platform by default, its "
        "ranks forked after one torch import, narrow cells side by side on its ranks. "
        "Every crash or hang is blamed on its cell and rank; each failure prints the line "
        "that reruns it (`cpmatrix repro ...`). Passes are cached (--no-cache runs "
        "everything). The report goes to --out: report.xml, results.json, report.html.",
        _EXAMPLES)
    add_selection(p)
    add_reporting(p)
    p.set_defaults(platform="cpu", only_kind=None, handler=run)
    add_run_arguments(p)
    # after --maxfail: the first flag of a dest gives its default (0, not None)
    p.add_argument("-x", "--exitfirst", dest="maxfail", action="store_const", const=1,
                   help="stop at the first cell that does not pass (as --maxfail 1)")
    s = add_command(
        sub, "spill", "run only the Triton register-spill gates (kind: spill)",
        "Run only the spill cells: each kernel compiled ahead of time for its GPU "
        "architecture (no GPU needed), its PTX's register spills checked against the "
        "budget (docs/spill.md).",
        ["cpmatrix spill", "cpmatrix spill -k arch=sm_90a"])
    add_selection(s)
    add_reporting(s)
    s.set_defaults(platform=None, only_kind="spill", handler=run)
    add_run_arguments(s, exclude=("mutants",))


def slowest_count(text: str) -> int:
    """``--durations N``: pytest's meaning, the N slowest cells listed at the end (0: all);
    a FILE there is the old spelling of ``--durations-from FILE``, refused naming it."""
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(
        f"expects N, the number of slowest cells to list (0: all), got {text!r}; recorded "
        "durations to balance shards by are read with --durations-from FILE")


def add_reporting(p: argparse.ArgumentParser) -> None:
    """How a run's outcome is shown: ``--full-trace``, ``--json``, ``--durations N``."""
    p.add_argument("--durations", type=slowest_count, default=None, metavar="N",
                   help="list the N slowest cells at the end (0: all), as pytest's")
    p.add_argument("--full-trace", action="store_true",
                   help="show every frame of a failure's traceback (default: your frames; "
                   "cpmatrix's and importlib's are hidden)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document on stdout (docs/cli-json.md; the human "
                   "output goes to stderr)")


def repro_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags a failing cell's repro line needs besides its id, each one that works from
    any folder: ``--matrix`` (absolute) where the project's table does not name this one
    (where it does, the line leaves it out: pasted anywhere in the project, the table is
    found again), and the runner, launcher or interpreter (absolute) where they differ
    from repro's defaults here."""
    flags: list[str] = []
    config = getattr(args, "config", None)
    if args.matrix and (config is None or config.get("matrix") != args.matrix):
        flags += ["--matrix", os.path.abspath(args.matrix)]
    defaults = args.parsers.get("repro") if hasattr(args, "parsers") else None
    for dest, flag in (("runner", "--runner"), ("launcher", "--launcher"),
                       ("python", "--python")):
        value = getattr(args, dest, None)
        default = defaults.get_default(dest) if defaults is not None else None
        if value is not None and value != default:
            text = str(value)
            if dest == "python" and os.sep in text:  # a path, not a name on PATH
                text = os.path.abspath(os.path.expanduser(text))
            flags += [flag, text]
    return tuple(flags)


def run(args: argparse.Namespace) -> int:
    """Parse, hand the run to the pipeline (which claims ``--out`` before selecting),
    print what it says (``--json``: the human lines to stderr, one document to stdout;
    an error before the document is ``main``'s to report)."""
    options = RunOptions.from_namespace(args)
    console = Console(plain=options.plain or args.json, full_trace=args.full_trace,
                      slowest=args.durations, stream=sys.stderr if args.json else None)
    code = execute(options, partial(_choose, args), console, executors=EXECUTORS)
    if args.json:
        emit(run_doc(code, console.seen, Path(options.out).resolve(), console.said))
    return code


def _choose(args: argparse.Namespace) -> Chosen:
    """The selection ``args`` make (``spill``: its kind only), or why none."""
    matrix, expansion, cells = select_from_args(args)
    if args.only_kind:
        cells = [c for c in cells if c.kind == args.only_kind]
    hints = keyword_hints(args, expansion)
    if cells:
        for hint in hints:
            print(f"note: {hint}", file=sys.stderr)
        print(f"{len(cells)} of {len(expansion.cells)} cells selected"
              f"{excluded_counts(expansion)}", file=sys.stderr)
    return Chosen(matrix=matrix, cells=cells, repro=repro_flags(args),
                  nothing=nothing_selected(args, len(expansion.cells), hints=hints)
                  if not cells else "")
