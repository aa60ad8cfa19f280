"""Every thread's stack on request, into the current cell's folder (in the ranks).

Standard library only.

Example (inside the worker)::

    dumper = StackDumper(folder.dump_request)     # a protocol.WorldFolder
    threading.Thread(target=dumper.watch, daemon=True).start()
    dumper.switch(out_root / cell_stacks(out_dir, rank))   # before each cell
"""

from __future__ import annotations

import faulthandler
import signal
import threading
import time
from pathlib import Path
from typing import TextIO

__all__ = ["StackDumper"]


class StackDumper:
    """Dumps every thread's stack into the current cell's ``stacks.txt`` on request.

    Two triggers: SIGUSR1 (faulthandler's C handler: works even while the GIL is
    held) and a request file (``WorldFolder.dump_request``) polled by this thread, which
    works when the supervisor cannot signal us (a container's or sandbox's own pid
    namespace). Blocking collectives release the GIL, so the thread gets to run.
    """

    def __init__(self, request: Path) -> None:
        self.request = request
        self.file: TextIO | None = None
        self.seen = 0.0
        self.lock = threading.Lock()

    def switch(self, path: Path) -> None:
        new = open(path, "w", encoding="utf-8")  # noqa: SIM115 - lives until the next cell
        faulthandler.register(signal.SIGUSR1, file=new, all_threads=True)
        with self.lock:
            old, self.file = self.file, new
        if old is not None:
            old.close()

    def watch(self) -> None:
        while True:
            time.sleep(0.2)
            try:
                stamp = self.request.stat().st_mtime
            except OSError:
                continue
            if stamp > self.seen:
                self.seen = stamp
                with self.lock:
                    if self.file is not None:
                        faulthandler.dump_traceback(file=self.file, all_threads=True)
                        self.file.flush()
