"""No process outlives a run: Linux process plumbing. Standard library only.

Three mechanisms, each covering what the others miss:

- **parent-death signal** (``PR_SET_PDEATHSIG``): the launcher gets SIGKILL when
  cpmatrix dies, and each rank when the launcher dies, even when cpmatrix is SIGKILLed itself.
- **child subreaper** (``PR_SET_CHILD_SUBREAPER``): a process a case started and then
  abandoned (a double fork, a daemon in its own session) is re-parented to the nearest
  subreaper - the rank while it lives, else cpmatrix - instead of to init, so it stays
  in a tree we can walk.
- **a world token in the environment**: every process of a world inherits
  ``CPMATRIX_WORLD=<run>/<world>``; ``/proc/<pid>/environ`` keeps it even after a
  process left the tree, so a world's leftovers are found and killed when it ends.

Example::

    >>> sorted(descendants(os.getpid())) == sorted(descendants(os.getpid()))
    True
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterable

__all__ = [
    "WORLD_TOKEN",
    "children",
    "descendants",
    "kill_all",
    "processes_with_token",
    "reap_orphans",
    "set_child_subreaper",
    "set_parent_death_signal",
    "stat_fields",
]

#: The environment variable naming the run and world a process belongs to.
WORLD_TOKEN = "CPMATRIX_WORLD"

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc: ctypes.CDLL | None = None


def _prctl(option: int, value: int) -> bool:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return int(_libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux: nothing to do
        return False


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent thread exits."""
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def set_child_subreaper(on: bool = True) -> bool:
    """Orphaned descendants of this process are re-parented to it instead of to init."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name, or None when it is gone.

    Field 3 of proc(5) (the state) is index 0 here, field ``n`` is index ``n - 3``. The
    name is cut at the *last* ``)``: a process may call itself ``a) b``.

    >>> fields = stat_fields(os.getpid())
    >>> fields is not None and fields[0] in "RSD"
    True
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from /proc, or None when it is gone."""
    fields = stat_fields(pid)
    try:
        return (fields[0], int(fields[1])) if fields else None
    except (IndexError, ValueError):
        return None


def _all_pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def children(pid: int | None = None) -> list[int] | None:
    """The direct children of ``pid`` (default: this process), zombies included, from
    ``/proc/PID/task/*/children``: a few small reads, not a walk of every process. None
    where the kernel does not offer the file (then use :func:`descendants`).

    >>> children() == [] or children() is None
    True
    """
    pid = os.getpid() if pid is None else pid
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                found += [int(c) for c in f.read().split()]
        except FileNotFoundError:  # a thread that just ended, or no such file at all
            if tid == str(pid):
                return None
        except (OSError, ValueError):
            continue
    return found


def descendants(root: int) -> list[int]:
    """Live (non-zombie) processes below ``root`` in the parent tree."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            children.setdefault(st[1], []).append(pid)
    out: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            out.append(child)
            stack.append(child)
    return out


def processes_with_token(value: str, *, prefix: bool = False) -> list[int]:
    """Live processes whose initial environment holds ``CPMATRIX_WORLD=value`` (with
    ``prefix``: any value starting with ``value``, e.g. a whole run's ``<run>/``)."""
    needle = f"{WORLD_TOKEN}={value}".encode()
    me = os.getpid()
    found = []
    for pid in _all_pids():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if any(item == needle or (prefix and item.startswith(needle))
               for item in env.split(b"\0")):
            st = _stat(pid)
            if st is not None and st[0] not in ("Z", "X"):
                found.append(pid)
    return found


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each pid, then reap the ones that are our own children (no zombies)."""
    mine = os.getpid()
    targets = [p for p in dict.fromkeys(pids) if p != mine]
    for pid in targets:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in targets:
        st = _stat(pid)
        if st is not None and st[1] == mine:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def reap_orphans(keep: Iterable[int] = ()) -> None:
    """Reap zombie children of ours that no ``Popen`` waits for (orphans a subreaper got).

    ``keep``: pids of children someone will ``wait()`` for; reaping them here would
    steal their exit status.
    """
    mine, kept = os.getpid(), set(keep)
    for pid in _all_pids():
        st = _stat(pid)
        if st is not None and st[1] == mine and st[0] == "Z" and pid not in kept:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
