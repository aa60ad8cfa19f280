"""Project config: ``[tool.cpmatrix]`` in the nearest pyproject.toml, keys named as the flags.

The table is found from the working folder upward, in the first ``pyproject.toml`` that
holds it (a pyproject.toml without it is passed over, as ruff passes over one without
``[tool.ruff]``). Its keys are the long flags without ``--`` (``matrix``, ``gates``,
``out``, ``platform``, ``runner``, ``remote-cache``, ...); a path is relative to the
pyproject.toml's folder. A value becomes the flag's default, so a flag on the command
line overrides it. An unknown key or a value of the wrong type is an error naming the
file, the line, the key and what is allowed (exit 2). ``cpmatrix config`` prints what
is in force and where each value came from.

Where a key means a place, each command reads it its own way: ``out`` is the run's
folder (``run``, ``spill``, ``show``), its report (``report``, ``gate --report
OUT/report.xml``), and the folder ``repro --failed`` reads while a repro writes to
``OUT/repro``; ``merge --out`` is never taken from it (a merge writes a new folder).

Example::

    [tool.cpmatrix]
    matrix = "tests/cp/matrix.yaml"
    gates = "tests/cp/gates.yaml"
    out = "out"
    runner = "auto"

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / "pyproject.toml").write_text('[tool.cpmatrix]\\nmatrix = "m.yaml"\\n')
    >>> (root / "sub").mkdir()
    >>> table = find_table(root / "sub")
    >>> table is not None and table.path == root / "pyproject.toml", table.lines["matrix"]
    (True, 2)
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cpmatrix.errors import SpecError
from cpmatrix.layout import REPORT_XML
from cpmatrix.suggest import suggestion

__all__ = ["NOT_IN_CONFIG", "PATH_KEYS", "PYPROJECT", "ProjectConfig", "Table", "apply_config",
           "describe", "find_table", "load_config"]

PYPROJECT: Final = "pyproject.toml"
_TABLE: Final = "tool.cpmatrix"
#: Keys holding a path (relative to the pyproject.toml's folder).
PATH_KEYS: Final = frozenset({"matrix", "gates", "out", "cache-dir", "durations-from"})
#: Flags of one invocation, never a project's setting.
NOT_IN_CONFIG: Final = frozenset({"help", "dry-run", "shard", "tag", "json", "version",
                                  "failed-first", "exitfirst"})
#: Keys of ``gate`` besides the run's flags.
_GATE_KEYS: Final = ("gates", "policy")


@dataclass(frozen=True)
class Table:
    """The raw ``[tool.cpmatrix]`` table of one pyproject.toml and each key's line."""

    path: Path
    values: Mapping[str, Any]
    lines: Mapping[str, int]


@dataclass(frozen=True)
class ProjectConfig:
    """The settings in force from a project's table: key -> value (paths absolute)."""

    path: Path | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def where(self, key: str) -> str:
        """``/x/pyproject.toml:12`` for a key the table sets."""
        line = self.lines.get(key, 0)
        return f"{self.path}:{line}" if line else str(self.path)


def find_table(start: Path) -> Table | None:
    """The first ``[tool.cpmatrix]`` from ``start`` upward, or None; a pyproject.toml that
    is not TOML is an error (it may hold the table)."""
    for folder in (start, *start.parents):
        path = folder / PYPROJECT
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            data = tomllib.loads(text)
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(str(path), 0, 0, "", f"cannot read it: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
            line, col = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
            raise SpecError(str(path), line, col, "",
                            f"TOML syntax error: {str(exc).split(' (at line')[0]}") from None
        tool = data.get("tool")
        table = tool.get("cpmatrix") if isinstance(tool, dict) else None
        if table is None:
            continue
        if not isinstance(table, dict):
            raise SpecError(str(path), _header_line(text), 1, _TABLE,
                            f"must be a table, got {type(table).__name__}")
        return Table(path=path, values=table, lines=_key_lines(text, table))
    return None


def _header_line(text: str) -> int:
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*\[\s*tool\s*\.\s*cpmatrix\s*\]", line):
            return n
    return 0


def _key_lines(text: str, table: Mapping[str, Any]) -> dict[str, int]:
    """The line of each key of the table (0 where it cannot be told, e.g. an inline
    table): after the ``[tool.cpmatrix]`` header, before the next header."""
    lines = text.splitlines()
    start = _header_line(text)
    found: dict[str, int] = {}
    if not start:
        return found
    for n in range(start, len(lines)):
        line = lines[n]
        if re.match(r"\s*\[", line):
            break
        m = re.match(r"\s*[\"']?([A-Za-z0-9_.-]+)[\"']?\s*=", line)
        if m and m.group(1) in table and m.group(1) not in found:
            found[m.group(1)] = n + 1
    return found


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "bool"
    if isinstance(action, argparse._AppendAction):
        return "list"
    if action.choices is not None:
        return "choice"
    if action.type is int:
        return "int"
    if action.type is float:
        return "float"
    return "str"


def config_keys(parsers: Mapping[str, argparse.ArgumentParser]) -> dict[str, argparse.Action]:
    """Every key the table may hold -> the flag it stands for (``run``'s flags and
    ``gate``'s ``--gates``/``--policy``)."""
    keys: dict[str, argparse.Action] = {}
    for command, only in (("run", None), ("gate", _GATE_KEYS)):
        for action in parsers[command]._actions:
            for option in action.option_strings:
                key = option[2:]
                if (option.startswith("--") and key not in NOT_IN_CONFIG
                        and (only is None or key in only)):
                    keys.setdefault(key, action)
    return dict(sorted(keys.items()))


def load_config(table: Table | None,
                parsers: Mapping[str, argparse.ArgumentParser]) -> ProjectConfig:
    """The table checked against the flags: typed values, paths made absolute."""
    if table is None:
        return ProjectConfig()
    allowed = config_keys(parsers)
    values: dict[str, Any] = {}
    for key, raw in table.values.items():
        line = table.lines.get(key, 0)
        where = f"{_TABLE}.{key}"

        def bad(message: str, what: str = "", hint: str = "", line: int = line,
                where: str = where) -> SpecError:
            return SpecError(str(table.path), line, 1 if line else 0, where, message, what,
                             hint)

        action = allowed.get(key)
        if action is None:
            raise bad(f"unknown key {key!r}", ", ".join(allowed), suggestion(key, allowed))
        values[key] = _typed(key, raw, action, table.path.parent, bad)
    return ProjectConfig(path=table.path, values=values, lines=dict(table.lines))


def _typed(key: str, raw: Any, action: argparse.Action, base: Path, bad: Any) -> Any:
    kind = _kind(action)
    if key == "durations":  # N: the slowest N cells listed
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise bad(f"expected N, a number of cells >= 0, got {raw!r}",
                      hint="recorded durations are durations-from = \"FILE\"")
        return raw
    if key in PATH_KEYS:
        if not isinstance(raw, str) or not raw:
            raise bad(f"expected a path (a string), got {raw!r}", "a path relative to "
                      "this pyproject.toml's folder")
        return os.path.normpath(base / os.path.expanduser(raw))
    if kind == "bool":
        if not isinstance(raw, bool):
            raise bad(f"expected true or false, got {raw!r}")
        return raw
    if kind in ("int", "float"):
        ok = (int, float) if kind == "float" else (int,)
        if isinstance(raw, bool) or not isinstance(raw, ok):
            raise bad(f"expected a{'n integer' if kind == 'int' else ' number'}, got {raw!r}")
        return raw
    if kind == "list":
        if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
            raise bad(f"expected a list of strings, got {raw!r}")
        return list(raw)
    if not isinstance(raw, str):
        raise bad(f"expected a string, got {raw!r}")
    if kind == "choice":
        choices = [str(c) for c in action.choices or ()]
        if raw not in choices:
            raise bad(f"{raw!r} is not allowed", ", ".join(choices), suggestion(raw, choices))
    if key == "python" and os.sep in raw:
        return os.path.normpath(base / os.path.expanduser(raw))
    return raw


def _for_command(command: str, key: str, value: Any) -> list[tuple[str, Any]] | None:
    """What ``key`` sets for ``command`` (dests and values); None: the flag of that name."""
    if key == "out":
        return {"run": [("out", value)], "spill": [("out", value)], "show": [("out", value)],
                "repro": [("out", os.path.join(value, "repro")), ("from_dir", value)],
                "report": [("report", Path(value))],
                "gate": [("report", Path(value, REPORT_XML))]}.get(command, [])
    if key == "matrix":
        return [("matrix", value)] if command in ("list", "show", "run", "spill", "repro",
                                                   "completion") else []
    if key == "gates":
        return [("gates", Path(value))] if command == "gate" else []
    if key == "policy":
        return [("policy", value)] if command == "gate" else []
    if key == "platform":
        return [("platform", value)] if command in ("list", "run", "spill") else []
    return None


def apply_config(config: ProjectConfig,
                 parsers: Mapping[str, argparse.ArgumentParser]) -> None:
    """The table's values as each command's defaults (a flag given still wins)."""
    for command, parser in parsers.items():
        for key, value in config.values.items():
            targets = _for_command(command, key, value)
            if targets is None:
                action = next((a for a in parser._actions if f"--{key}" in a.option_strings),
                              None)
                targets = [] if action is None else [(action.dest, value)]
            for dest, typed in targets:
                parser.set_defaults(**{dest: typed})
                for action in parser._actions:
                    if action.dest == dest:
                        action.required = False
    if config.path is not None:
        for parser in parsers.values():
            parser.set_defaults(config=config)


def describe(config: ProjectConfig, parsers: Mapping[str, argparse.ArgumentParser],
             start: Path) -> list[str]:
    """``cpmatrix config``'s lines: the file, then each key, its value and its source."""
    keys = config_keys(parsers)
    if config.path is None:
        head = [f"no [{_TABLE}] in a {PYPROJECT} from {start} upward: the defaults apply",
                "(`cpmatrix init` writes one; keys: the flags without '--')"]
    else:
        head = [f"config: {config.path} [{_TABLE}]"]
    rows: list[tuple[str, str, str]] = []
    for key in _ordered(keys, config.values):
        if key in config.values:
            rows.append((key, _show(config.values[key]), config.where(key)))
        else:
            default = keys[key].default
            rows.append((key, _show(default), "default"))
    width = max(len(k) for k, _, _ in rows)
    vwidth = min(48, max(len(v) for _, v, _ in rows))
    return head + [f"  {k:<{width}} = {v:<{vwidth}}  ({src})" for k, v, src in rows]


def _ordered(keys: Iterable[str], given: Mapping[str, Any]) -> list[str]:
    """The keys the table sets first (in its order), then the rest alphabetically."""
    return [k for k in given] + [k for k in keys if k not in given]


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)
