"""A target whose ``before_fork`` starts a thread (what a world's early imports could
do): the launcher must start the ranks as new processes, never fork."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

#: The launcher's pid: a rank forked from it inherits this value, a new process does not.
IMPORTED_IN = os.getpid()


def before_fork(argv: list[str]) -> None:
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    (out / f"rank{os.environ['RANK']}.pid").write_text(
        f"{os.getpid()} {os.environ['WORLD_SIZE']} {IMPORTED_IN}\n")
    return 0
