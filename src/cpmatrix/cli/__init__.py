"""The ``cpmatrix`` command: one small module per subcommand, registered in one table.

Each module has ``add_parsers(sub)`` (its parser, with ``handler`` set) and a ``run(args)``
returning an exit code. ``main`` maps errors to the codes every command shares: 0 ok,
1 test failures, 2 usage or spec error, 3 nothing selected, 4 internal error of cpmatrix,
128+N stopped by signal N.

Example::

    $ cpmatrix list --matrix matrix/parity.yaml -k "ring and 2x2" --json
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Final

from cpmatrix.cli import gate, list, merge, report, repro, run, show
from cpmatrix.cli.common import Parser
from cpmatrix.errors import ExitCode, SpecError, UsageError

__all__ = ["COMMANDS", "build_parser", "main"]

#: Every subcommand's module, in the order ``cpmatrix --help`` lists them.
COMMANDS: Final = (list, show, run, merge, repro, gate, report)


def build_parser() -> Parser:
    parser = Parser(prog="cpmatrix", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args))
    except (SpecError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return 128 + int(getattr(exc, "signum", 2))
    except BrokenPipeError:
        return ExitCode.OK
    except Exception:  # a bug of cpmatrix: its own exit code, never 1 ("tests failed")
        print("cpmatrix: internal error (a bug; please report it with this traceback):\n"
              + traceback.format_exc(), file=sys.stderr)
        return ExitCode.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
