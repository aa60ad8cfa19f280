"""``cpmatrix config``: the settings in force here, and where each came from.

Example::

    $ cpmatrix config
    config: /home/me/proj/pyproject.toml [tool.cpmatrix]
      matrix = /home/me/proj/tests/cp/matrix.yaml  (/home/me/proj/pyproject.toml:2)
      ...
      runner = local                               (default)
"""

from __future__ import annotations

import argparse
import json

from cpmatrix.cli.common import add_command
from cpmatrix.cli.config import ProjectConfig, config_keys, describe
from cpmatrix.errors import ExitCode

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "config", "print the settings in force and where each came from",
        "Print the project's [tool.cpmatrix] (found from this folder upward, as pytest "
        "and ruff find theirs): each key, its value (paths made absolute) and its source "
        "(file:line, or default). Flags on a command line override these.",
        ["cpmatrix config", "cpmatrix config --json"])
    p.add_argument("--json", action="store_true", help="print a JSON object instead")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config: ProjectConfig = getattr(args, "config", None) or ProjectConfig()
    if args.json:
        keys = config_keys(args.parsers)
        print(json.dumps({
            "file": str(config.path) if config.path else None,
            "settings": {k: {"value": config.values.get(k, keys[k].default),
                             "source": config.where(k) if k in config.values else "default"}
                         for k in keys},
        }, indent=1, default=str))
        return ExitCode.OK
    print("\n".join(describe(config, args.parsers, args.cwd)))
    return ExitCode.OK
