"""``cpmatrix init``: starter cases, matrix and gates, and the ``[tool.cpmatrix]`` table.

Writes ``DIR/cases.py``, ``DIR/matrix.yaml``, ``DIR/gates.yaml`` (``DIR``: ``tests/cp``
by default) and the table in ``./pyproject.toml`` (appended to one that has no such
table, or a new file). It refuses (exit 2, nothing written) when any of them exists:
it never overwrites a file. Then ``cpmatrix list``, ``run`` and ``gate`` work with no
flag at all.

Example::

    $ cpmatrix init && cpmatrix run && cpmatrix gate
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from cpmatrix.cli import starter
from cpmatrix.cli.common import add_command
from cpmatrix.cli.config import PYPROJECT
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.layout import REPORT_XML

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "init", "write starter cases, matrix, gates and the [tool.cpmatrix] table",
        "Write a starter project that runs green at once: DIR/cases.py, DIR/matrix.yaml, "
        "DIR/gates.yaml and the [tool.cpmatrix] table of ./pyproject.toml. Refuses to "
        "overwrite any file.",
        ["cpmatrix init", "cpmatrix init --dir tests/parallel"])
    p.add_argument("--dir", default="tests/cp", metavar="DIR",
                   help="folder of the starter files, relative to here (default: %(default)s)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    here = Path.cwd()
    folder = Path(args.dir)
    if folder.is_absolute():
        try:
            folder = folder.relative_to(here)
        except ValueError:
            raise UsageError(f"--dir {args.dir}: must be inside this folder ({here}): the "
                             "table names it relative to ./pyproject.toml") from None
    files = {here / folder / "cases.py": starter.CASES,
             here / folder / "matrix.yaml": starter.MATRIX,
             here / folder / "gates.yaml": starter.GATES}
    there = [str(p.relative_to(here)) for p in files if p.exists()]
    pyproject = here / PYPROJECT
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    if text:
        try:
            tool = tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{pyproject}: not TOML ({exc}); fix it first") from None
        if isinstance(tool, dict) and "cpmatrix" in tool:
            there.append(f"{PYPROJECT} [tool.cpmatrix]")
    if there:
        raise UsageError(f"init: {', '.join(there)} already exist(s); init never overwrites "
                         "(move them away, or use --dir DIR for the starter files)")
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    rel = folder.as_posix()
    sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
    pyproject.write_text(text + sep + starter.table(rel), encoding="utf-8")
    print(f"wrote {rel}/cases.py, {rel}/matrix.yaml, {rel}/gates.yaml and [tool.cpmatrix] "
          f"in {PYPROJECT}" + (" (appended)" if text else ""))
    print("next:")
    for line in ("cpmatrix list            # the cells the matrix makes",
                 "cpmatrix run             # run them: one world, the report in out/",
                 f"cpmatrix gate            # the release policy over out/{REPORT_XML}",
                 "cpmatrix config          # the settings in force, and where each is set"):
        print(f"  {line}")
    return ExitCode.OK
