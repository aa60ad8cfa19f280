"""The options the pytest plugin declares, read without a pytest session: a recording
stand-in for pytest's parser (one group, each flag declared once)."""

from __future__ import annotations

from typing import Any

from cpmatrix.kinds.pytest import plugin


class _Group:
    """A pytest option group that keeps what is declared on it."""

    def __init__(self) -> None:
        self.options: dict[str, dict[str, Any]] = {}

    def addoption(self, flag: str, **kwargs: Any) -> None:
        assert flag not in self.options, f"{flag} declared twice"
        self.options[flag] = kwargs


class _Parser:
    def __init__(self) -> None:
        self.group = _Group()

    def getgroup(self, name: str, description: str = "") -> _Group:
        return self.group


def plugin_options() -> dict[str, dict[str, Any]]:
    """Flag -> the keyword arguments ``pytest_addoption`` declared it with."""
    parser = _Parser()
    plugin.pytest_addoption(parser)
    return parser.group.options
