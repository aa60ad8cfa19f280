"""Errors users see, and the exit codes every command shares.

Example::

    >>> str(SpecError("m.yaml", 3, 5, "targets[0].level", "unknown level 'x'", "unit, layer"))
    "m.yaml:3:5: targets[0].level: unknown level 'x' (allowed: unit, layer)"
    >>> str(SpecError("m.yaml", 0, 0, "", "no such matrix file"))
    'm.yaml: no such matrix file'
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode", "SpecError", "UsageError"]


class ExitCode(IntEnum):
    """Exit codes: an interface, documented in the README and tested."""

    OK = 0
    FAILURES = 1
    USAGE = 2
    NOTHING_SELECTED = 3
    #: cpmatrix itself failed (a bug): never confused with 1, "tests failed". The run
    #: still writes its report, with the unfinished cells failing and naming the error.
    INTERNAL = 4
    #: 128 + N: stopped by signal N (130 Ctrl-C, 143 SIGTERM); the report is written.


class UsageError(Exception):
    """Bad command-line input (exit 2)."""


class SpecError(Exception):
    """A malformed matrix (exit 2): names file, line, column, YAML path and the fix.

    ``line`` 0 means the problem is with the file as a whole (e.g. it does not
    exist); the message then names only the file.
    """

    def __init__(
        self,
        file: str,
        line: int,
        column: int,
        yaml_path: str,
        message: str,
        allowed: str = "",
        hint: str = "",
    ) -> None:
        self.file = file
        self.line = line
        self.column = column
        self.yaml_path = yaml_path
        self.message = message
        self.allowed = allowed
        #: A suggestion after the allowed values ("did you mean 'layer'?").
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line > 0 else self.file
        path = f" {self.yaml_path}:" if self.yaml_path else ""
        allowed = f" (allowed: {self.allowed})" if self.allowed else ""
        hint = f"; {self.hint}" if self.hint else ""
        return f"{where}:{path} {self.message}{allowed}{hint}"
