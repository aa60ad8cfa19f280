"""cpmatrix: multi-rank PyTorch parity tests, from a YAML matrix to a release gate.

Each subcommand is a module here with ``add_parsers(sub)`` (its parser, with ``handler``
set) and a ``run(args)`` returning an exit code. ``main`` reads the project's
``[tool.cpmatrix]`` (:mod:`cpmatrix.cli.config`) into the flags' defaults, parses, and
maps errors to the codes every command shares: 0 ok, 1 test failures, 2 usage or spec
error, 3 nothing selected, 4 internal error of cpmatrix, 128+N stopped by signal N.

Example::

    $ cpmatrix list -k "ring and 2x2" --json
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from cpmatrix import __version__
from cpmatrix.cli import (
    completion,
    config_cmd,
    gate,
    init,
    list,
    merge,
    report,
    repro,
    run,
    show,
)
from cpmatrix.cli.common import Parser
from cpmatrix.cli.config import apply_config, find_table, load_config
from cpmatrix.cli.json_out import JSON_COMMANDS, emit, emitted, error_doc
from cpmatrix.errors import ExitCode, SpecError, UsageError
from cpmatrix.suggest import did_you_mean

__all__ = ["COMMANDS", "build_parser", "main"]

#: Every subcommand's module, in the order ``cpmatrix --help`` lists them.
COMMANDS: Final = (init, list, run, show, repro, gate, report, merge, config_cmd, completion)

DESCRIPTION: Final = """\
cpmatrix runs multi-rank PyTorch parity tests: a YAML matrix (mesh x dtype x path x your
own axes) becomes cells, many cells run in each persistent world (gloo on CPU, nccl on
GPUs), every crash or hang is blamed on its cell and rank, one JUnit/HTML report holds
the evidence, and a gate decides a release from it.

Settings come from [tool.cpmatrix] in the nearest pyproject.toml (keys: the flags
without '--'); flags override them. `cpmatrix config` shows what is in force."""

EPILOG: Final = """\
first steps:
  cpmatrix init                 # starter cases, matrix, gates and the pyproject table
  cpmatrix run                  # run the matrix: one world per platform, report in out/
  cpmatrix repro --failed       # rerun the last run's failures, streaming their logs
  cpmatrix show CELL            # a cell's last result: message, ranks, evidence, logs

exit codes: 0 ok, 1 test failures, 2 usage or spec error, 3 nothing selected,
4 internal error of cpmatrix, 128+N stopped by signal N (docs/running.md)"""


def build_parser(cwd: Path | None = None) -> Parser:
    """The parser, its defaults taken from the project's ``[tool.cpmatrix]`` found from
    ``cwd`` (default: the working folder) upward."""
    parser = Parser(prog="cpmatrix", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cpmatrix {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser,
                                metavar="COMMAND")
    for command in COMMANDS:
        command.add_parsers(sub)
    parsers = dict(sub.choices)
    start = cwd or Path.cwd()
    apply_config(load_config(find_table(start), parsers), parsers)
    parser.set_defaults(parsers=parsers, cwd=start)
    return parser


def _parse(parser: Parser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse; an unknown flag is refused naming the nearest flag of its command (before
    the command: of cpmatrix itself, ``--versoin``)."""
    top = [o for a in parser._actions for o in a.option_strings]
    if argv and argv[0].startswith("-") and argv[0].split("=", 1)[0] not in top:
        parser.print_usage(sys.stderr)
        raise UsageError(f"unrecognized argument: {argv[0]}"
                         + did_you_mean(argv[0].split("=", 1)[0], top))
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = args.parsers.get(getattr(args, "command", None) or "", parser)
        flags = [o for a in command._actions for o in a.option_strings]
        unknown = [e for e in extra if e.startswith("-")] or extra
        hint = did_you_mean(unknown[0].split("=", 1)[0], flags)
        command.print_usage(sys.stderr)
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def _json_command(argv: Sequence[str]) -> str | None:
    """The command whose ``--json`` document stdout owes, read from the words alone (the
    parse itself may be what fails): ``run`` for ``cpmatrix run -k x --json``."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    command = next((w for w in words if not w.startswith("-")), None)
    command = "run" if command == "spill" else command  # spill is run, of one kind
    return command if command in JSON_COMMANDS and "--json" in words else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code. With ``--json``, stdout
    holds one document whatever the exit: where the command stopped before printing its
    own, the error document (:func:`cpmatrix.cli.json_out.error_doc`) says why."""
    words = [*(sys.argv[1:] if argv is None else argv)]
    as_json = _json_command(words)
    before = emitted()
    code: int
    message = ""
    try:
        args = _parse(build_parser(), words)
        code = int(args.handler(args))
    except (SpecError, UsageError) as exc:
        message = str(exc)
        print(f"error: {exc}", file=sys.stderr)
        code = ExitCode.USAGE
    except KeyboardInterrupt as exc:
        message = "interrupted"
        print("interrupted", file=sys.stderr)
        code = 128 + int(getattr(exc, "signum", 2))
    except BrokenPipeError:
        return ExitCode.OK
    except Exception:  # a bug of cpmatrix: its own exit code, never 1 ("tests failed")
        message = "internal error of cpmatrix (a bug; the traceback is on stderr)"
        print("cpmatrix: internal error (a bug; please report it with this traceback):\n"
              + traceback.format_exc(), file=sys.stderr)
        code = ExitCode.INTERNAL
    if as_json and emitted() == before:
        emit(error_doc(as_json, code, message or f"exit {code} without a document"))
    return code


if __name__ == "__main__":
    sys.exit(main())
