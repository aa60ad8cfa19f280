"""The pytest front's own flags, declared as the run's are (:class:`FrontOptions`).

The run's settings the front exposes (``--cpmatrix-runner``, ``-launcher``,
``-world-ranks``, ``-abort-grace``) are :class:`~cpmatrix.supervise.options.RunOptions` fields
with a pytest flag; the front's own (``--cpmatrix``, ``-out``, ``-timeout``, ``-device``,
``-cache``) are fields here, declared the same way (:func:`~cpmatrix.supervise.options.
pytest_flag`), added by the same function and read back by the same one.

Example::

    >>> FrontOptions.from_pytest({"cpmatrix_device": "cpu"}.get).device
    'cpu'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cpmatrix.defaults import TIMEOUT_S
from cpmatrix.supervise.options import RunOptions, add_pytest_options, pytest_flag, pytest_values

__all__ = ["DEVICES", "FrontOptions", "add_front_options"]

#: ``--cpmatrix-device``: ``auto`` is cuda when a GPU is visible.
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True, slots=True)
class FrontOptions:
    """What ``pytest --cpmatrix`` asks beyond the run's settings."""

    enabled: bool = field(default=False, metadata=pytest_flag(
        "--cpmatrix", "run the multi-rank tests (torch's MultiProcessTestCase family, "
        "@pytest.mark.world, DeepSpeed-style world_size classes) in cpmatrix's "
        "persistent worlds; every other test runs as usual", action="store_true"))
    out: str | None = field(default=None, metadata=pytest_flag(
        "--cpmatrix-out", "where the worlds' logs and reports go (default: "
        "<rootdir>/.cpmatrix/pytest)", metavar="DIR"))
    timeout: float | None = field(default=None, metadata=pytest_flag(
        "--cpmatrix-timeout", "timeout of a multi-rank test without a timeout marker "
        f"(default: pytest-timeout's --timeout if set, else {TIMEOUT_S})", metavar="S",
        type=float))
    device: str = field(default="auto", metadata=pytest_flag(
        "--cpmatrix-device", "cpu (gloo) or cuda (nccl; one GPU per rank); auto: cuda when "
        "a GPU is visible", choices=DEVICES))
    cache: bool = field(default=False, metadata=pytest_flag(
        "--cpmatrix-cache", "reuse cpmatrix's cached passes (off: a pytest run runs its "
        "tests)", action="store_true"))

    @classmethod
    def from_pytest(cls, getoption: Callable[[str], Any]) -> FrontOptions:
        """The flags :func:`add_front_options` declared, read with ``config.getoption``."""
        return cls(**pytest_values(cls, getoption))


def add_front_options(group: Any) -> None:
    """Every ``--cpmatrix*`` flag on pytest's option ``group``, in the order ``--help``
    lists them: the switch, where and how long, the run's settings, then device and
    cache."""
    add_pytest_options(group, FrontOptions, only=("enabled", "out", "timeout"))
    add_pytest_options(group, RunOptions)
    add_pytest_options(group, FrontOptions, only=("device", "cache"))
