"""Ctrl-C and SIGTERM stop a run cleanly: worlds killed, report written, exit 128+N.

Inside :func:`stop_on_signals`, SIGINT and SIGTERM raise :class:`StopRequested` (a
``KeyboardInterrupt``) in the main thread, once. The run loop catches it, kills every
world, and writes the report with the finished cells and the unfinished ones as
``interrupted``. A second signal while that happens is only acknowledged: the report
is never cut short. A batch scheduler's SIGTERM and a user's Ctrl-C end the same way.

Example::

    with stop_on_signals() as stopper:
        report = run_cells(..., stopper=stopper)   # returns; report.stopped_by: the signal
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["StopRequested", "Stopper", "exit_code_for", "stop_on_signals"]


class StopRequested(KeyboardInterrupt):
    """The run was asked to stop by ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code_for(signum: int) -> int:
    """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class Stopper:
    """Turns the first SIGINT/SIGTERM into :class:`StopRequested`, unless held.

    Once :meth:`hold` is called (the report is being written), a signal is only noted in
    ``signum``: nothing interrupts the writing, and the caller exits 128+N afterwards.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.held = False

    def hold(self) -> None:
        self.held = True

    def handler(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None or self.held:
            self.signum = self.signum or signum
            print(f"cpmatrix: {name}: finishing the report first", file=sys.stderr, flush=True)
            return
        self.signum = signum
        print(f"cpmatrix: {name}: stopping the worlds, then writing the report",
              file=sys.stderr, flush=True)
        raise StopRequested(signum)


@contextmanager
def stop_on_signals() -> Iterator[Stopper]:
    """Within the block, SIGINT/SIGTERM raise :class:`StopRequested` once (see Stopper)."""
    stopper = Stopper()
    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, stopper.handler)
    try:
        yield stopper
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
