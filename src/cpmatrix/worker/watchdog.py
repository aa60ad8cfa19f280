"""Die with the supervisor: run a command, and kill its whole tree once cpmatrix is gone.

Inside a container the parent-death signal cannot help: the container's first process is
a child of the container runtime, not of cpmatrix, and killing the ``docker run`` client
(even with SIGKILL) leaves the container running. The docker runner therefore starts the
world's launcher under this watchdog, in the host's pid namespace (``--pid=host``), with
the supervisor's pid and its start time (so a recycled pid is never mistaken for it).
Every half second the watchdog checks the supervisor; when it is gone, every process below
the watchdog is killed and the watchdog exits 137, which ends the container. Signals sent
to the watchdog (the docker client proxies SIGTERM, SIGINT, SIGUSR1) are passed on to the
command. Standard library only.

Example (in a container started by the docker runner)::

    python3 -m cpmatrix.worker.watchdog 4242 918273 BOOT_ID -- python3 -m torch.distributed.run ...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from cpmatrix.module_names import WATCHDOG
from cpmatrix.worker.procs import (
    WORLD_TOKEN,
    descendants,
    kill_all,
    processes_with_token,
    set_child_subreaper,
    stat_fields,
)

__all__ = ["POLL_SECONDS", "alive", "boot_id", "start_time", "watch_argv"]

#: How often the supervisor is checked: leftovers live at most this long after it died.
POLL_SECONDS = 0.5
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22),
    or None when it is gone."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of proc(5)
    except (IndexError, ValueError):
        return None


def boot_id() -> str:
    """This kernel's boot id: the same in every container of one machine, unique per boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def alive(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (not a zombie)."""
    fields = stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return start_time(pid) == started


def watch_argv(python: str, pid: int, argv: Sequence[str]) -> list[str]:
    """``argv`` run under the watchdog of supervisor ``pid`` (its start time read now).

    >>> watch_argv("python3", os.getpid(), ["true"])[:3]
    ['python3', '-m', 'cpmatrix.worker.watchdog']
    """
    started = start_time(pid)
    if started is None:
        raise ValueError(f"cannot watch process {pid}: it is not running")
    return [python, "-m", WATCHDOG, str(pid), str(started), boot_id(), "--",
            *argv]


def main(args: Sequence[str]) -> int:
    if len(args) < 5 or args[3] != "--":
        print(f"usage: python -m {WATCHDOG} PID START_TIME BOOT_ID -- COMMAND...",
              file=sys.stderr)
        return 2
    pid, started, argv = int(args[0]), int(args[1]), list(args[4:])
    here = args[2] == boot_id()  # else the supervisor runs on another machine
    set_child_subreaper()  # what a case abandons stays below us, where the sweep finds it
    child = subprocess.Popen(argv)
    for sig in _FORWARDED:
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    while True:
        code = child.poll()
        if code is not None:
            return code if code >= 0 else 128 - code
        if here and not alive(pid, started):
            print(f"{WATCHDOG}: supervisor {pid} is gone; killing the world",
                  file=sys.stderr, flush=True)
            token = os.environ.get(WORLD_TOKEN)
            for _ in range(2):  # a second pass for what forked while the first one ran
                kill_all(descendants(os.getpid()))
                if token:
                    kill_all(processes_with_token(token))
            return 137
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
