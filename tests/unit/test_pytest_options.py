"""The pytest front's flags: all declared as fields, the front's own ones unchanged.

Every ``--cpmatrix*`` flag is a field of :class:`~cpmatrix.supervise.options.RunOptions` or of
:class:`~cpmatrix.kinds.pytest.options.FrontOptions` with a pytest flag, added by one
function; the plugin declares none by hand. The front's own flags keep the names,
defaults and help users know (frozen here as they were when declared by hand).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

from cpmatrix.kinds.pytest import plugin
from cpmatrix.kinds.pytest.options import FrontOptions
from cpmatrix.supervise.options import RunOptions
from plugin_options import plugin_options

PLUGIN = Path(plugin.__file__)

#: The front's own flags, as ``group.addoption`` got them when the plugin wrote them out.
FROZEN: dict[str, dict[str, Any]] = {
    "--cpmatrix": {"action": "store_true", "default": False, "help": (
        "run the multi-rank tests (torch's MultiProcessTestCase family, "
        "@pytest.mark.world, DeepSpeed-style world_size classes) in cpmatrix's persistent "
        "worlds; every other test runs as usual")},
    "--cpmatrix-out": {"metavar": "DIR", "default": None, "help": (
        "where the worlds' logs and reports go (default: <rootdir>/.cpmatrix/pytest)")},
    "--cpmatrix-timeout": {"metavar": "S", "type": float, "default": None, "help": (
        "timeout of a multi-rank test without a timeout marker (default: pytest-timeout's "
        "--timeout if set, else 300)")},
    "--cpmatrix-device": {"default": "auto", "choices": ("auto", "cpu", "cuda"), "help": (
        "cpu (gloo) or cuda (nccl; one GPU per rank); auto: cuda when a GPU is visible")},
    "--cpmatrix-cache": {"action": "store_true", "default": False, "help": (
        "reuse cpmatrix's cached passes (off: a pytest run runs its tests)")},
}


def _fields_with_flags() -> dict[str, tuple[type, str]]:
    return {f.metadata["pytest"][0]: (cls, f.name) for cls in (RunOptions, FrontOptions)
            for f in dataclasses.fields(cls) if f.metadata.get("pytest") is not None}


def test_the_fronts_own_flags_keep_their_names_defaults_and_help() -> None:
    options = plugin_options()
    assert {flag: options[flag] for flag in FROZEN} == FROZEN


def test_every_flag_is_a_declared_field_and_none_is_written_by_hand() -> None:
    options = plugin_options()
    assert set(options) == set(_fields_with_flags())
    hand = [n.lineno for n in ast.walk(ast.parse(PLUGIN.read_text()))
            if isinstance(n, ast.Attribute) and n.attr == "addoption"]
    assert hand == [], f"plugin.py declares flags by hand (lines {hand})"


def test_the_flags_read_back_as_the_declared_defaults() -> None:
    values = {flag.removeprefix("--").replace("-", "_"): o["default"]
              for flag, o in plugin_options().items()}
    assert FrontOptions.from_pytest(values.__getitem__) == FrontOptions()
    given = {**values, "cpmatrix_device": "cpu", "cpmatrix_timeout": 7.0}
    read = FrontOptions.from_pytest(given.__getitem__)
    assert (read.device, read.timeout) == ("cpu", 7.0)
