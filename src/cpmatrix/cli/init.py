"""``cpmatrix init``: starter cases, matrix and gates, and the ``[tool.cpmatrix]`` table.

Writes ``DIR/cases.py``, ``DIR/matrix.yaml``, ``DIR/gates.yaml`` (``DIR``: ``tests/cp``
by default) and the table in ``./pyproject.toml`` (appended to one that has no such
table, or a new file). Every place it would write is checked before any is written:
it refuses (exit 2, nothing written, each conflict named) when a starter file exists, a
folder on the way is a file, or the table is there; and inside a project whose
pyproject.toml above already has ``[tool.cpmatrix]`` (a second table here would take
over below this folder). Then ``cpmatrix list``, ``run`` and ``gate`` work with no flag
at all.

Example::

    $ cpmatrix init && cpmatrix run && cpmatrix gate
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from cpmatrix.cli import starter
from cpmatrix.cli.common import add_command
from cpmatrix.cli.config import PYPROJECT, find_table
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


def _has_table(pyproject: Path) -> bool:
    """``pyproject`` holds ``[tool.cpmatrix]``; not TOML is a usage error (fix it first)."""
    try:
        tool = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{pyproject}: not TOML ({exc}); fix it first") from None
    return isinstance(tool, dict) and "cpmatrix" in tool


def _conflict(path: Path, here: Path) -> str:
    """Why ``path`` cannot be written without harm ("" when it can): a starter file that
    exists, or a folder on its way that is a file."""
    rel = path.relative_to(here)
    if path.name != PYPROJECT and path.exists():
        return f"{rel} (exists)"
    if path.name == PYPROJECT and path.exists() and not path.is_file():
        return f"{rel} (not a file)"
    for parent in path.parents:
        if parent == here or here not in parent.parents:
            break
        if parent.exists() and not parent.is_dir():
            return f"{parent.relative_to(here)} (a file, where a folder is needed)"
    return ""


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
    pyproject = here / PYPROJECT
    above = find_table(here.parent) if here.parent != here else None
    if above is not None and not (pyproject.is_file() and _has_table(pyproject)):
        raise UsageError(
            f"init: this folder is inside a project that already has [tool.cpmatrix] "
            f"({above.path}); cpmatrix finds that one from here. A second table here would "
            "take over below this folder: run `cpmatrix config` to see the settings in "
            f"force, or run `cpmatrix init` in {above.path.parent} (nothing was written)")
    # Every place it would write, checked before anything is written.
    there = [_conflict(p, here) for p in (*files, pyproject)]
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    if text and _has_table(pyproject):
        there.append(f"{PYPROJECT} [tool.cpmatrix]")
    conflicts = [c for c in there if c]
    if conflicts:
        raise UsageError("init: nothing was written; in the way: " + ", ".join(conflicts)
                         + " (init never overwrites: move them away, or use --dir DIR for "
                         "the starter files)")
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
