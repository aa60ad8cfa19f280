"""Processes a cell starts: followed, or the cell is unobservable (never cached).

Standard library only; runs in the ranks, in the compile job and in the children it
follows (through ``follow_site/sitecustomize.py``).

An audit hook sees the reads of its own process only. A cell that runs a helper
(``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``,
``os.fork``, multiprocessing) depends on what that process reads too. The rule
(docs/cache.md, "Processes a cell starts"):

- the **executable** (resolved on ``PATH``) and every **argument that names an existing
  file** go into the cell's observed set;
- a **Python child** that inherits the cell's environment is **followed**: the cell's
  environment carries :data:`FOLLOW_ENV` (a folder) and puts ``follow_site`` first on
  ``PYTHONPATH``, whose ``sitecustomize`` installs the same read observer in the child,
  which appends each read to a log of its own in that folder (a line per read, so a
  child that ends with ``os._exit`` loses nothing); a forked child (``os.fork``,
  multiprocessing's fork) switches its inherited observer to such a log. The rank merges
  every log into the cell's set when the cell ends;
- every start the rank (or a followed child) saw must be matched by the log of the
  process it started (a child: same parent pid and ``sys.orig_argv``; an ``exec``: same
  pid and argv; a fork: a forked log of that parent). A start nobody answered (a native
  program such as ``cat``, a shell, Python started with ``-I``/``-E``/``-S`` or with an
  environment that drops :data:`FOLLOW_ENV`, a child still starting when the cell ended)
  makes the cell **unobservable**: its observed set holds an :data:`UNOBSERVED` signature
  with the reason, and the supervisor stores nothing (the reason is in the report as the
  cell's ``not_cached`` evidence). ``os.system`` always does (a shell resolves and reads
  what it runs itself).

What no audit hook can see: a native program's own opens (only an ``strace``/
``fanotify``-grade watcher could; none is used), processes started from native code
(a C extension calling ``fork``/``exec``, ``ctypes``), and files a child reads after
the cell ended. The first makes the cell unobservable through the start event; the
other two are limits stated in docs/cache.md.

Example::

    >>> describe(["cat", "data.txt"])
    '`cat data.txt`'
    >>> expectation("subprocess.Popen", ("cat", ["cat", "data.txt"], None, None), pid=7)
    ('spawn', 7, ['cat', 'data.txt'])
    >>> expectation("os.system", (b"ls",), pid=7)[2][:27]
    'it ran `ls` through os.syst'
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from cpmatrix.paths import IMPORT_ROOT, PACKAGE_DIR

__all__ = ["CHANGED", "FOLLOW_ENV", "SITE_DIR", "SKIP_ENV", "STARTS", "UNOBSERVED",
           "ChildLog", "add_children", "collect", "describe",
           "enter_follow", "expectation", "follow_environment", "leave_follow",
           "merge_signatures", "named_files", "unfollowed"]

#: The folder followed children write their logs to (set in the cell's environment).
FOLLOW_ENV = "CPMATRIX_FOLLOW"
#: The observer's ``skip`` folders, as JSON, for the children.
SKIP_ENV = "CPMATRIX_FOLLOW_SKIP"
#: The folder whose ``sitecustomize`` installs the observer in a Python child.
SITE_DIR = str(PACKAGE_DIR / "worker" / "follow_site")
#: The signature prefix of an unobservable start: ``?`` + why (never a content hash).
UNOBSERVED = "?"
#: The signature of a path whose content changed while the cell depended on it.
CHANGED = "!"
#: The audit events of a process start (multiprocessing's spawn and forkserver raise
#: none: their children are Python and follow themselves, unasked).
STARTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.spawn", "os.exec",
                    "os.fork", "os.forkpty", "os.system"})

#: A start the cell made: ("spawn" | "exec", pid it concerns, argv), ("fork", pid, None),
#: or ("x", key, reason) for one that can never be followed.
Expectation = tuple[str, Any, Any]


def describe(argv: Sequence[str]) -> str:
    """A command line as a reader pastes it, quoted for a POSIX shell."""
    return f"`{shlex.join(argv)}`"


def _text(value: Any) -> str:
    return os.fsdecode(value) if isinstance(value, str | bytes | os.PathLike) else str(value)


def _argv(args: Any) -> list[str]:
    if isinstance(args, str | bytes | os.PathLike):
        return [_text(args)]
    try:
        return [_text(a) for a in args]
    except TypeError:
        return []


def expectation(event: str, args: tuple[Any, ...], *, pid: int) -> Expectation | None:
    """What the audit ``event`` of a process start means for process ``pid``: a start to
    be matched by a child's log, or one that can never be followed (``x``); None for
    any other event, and for an ``exec`` of a path that is not there (``os.execvp``
    tries each ``PATH`` folder in turn; only the one that exists runs)."""
    if event == "subprocess.Popen":
        return ("spawn", pid, _argv(args[1]))
    if event == "os.posix_spawn":
        return ("spawn", pid, _argv(args[1]))
    if event == "os.spawn":  # (mode, path, args, env)
        return ("spawn", pid, _argv(args[2]))
    if event == "os.exec":  # (path, args, env)
        if not os.path.isfile(_text(args[0])):
            return None
        return ("exec", pid, _argv(args[1]))
    if event in ("os.fork", "os.forkpty"):
        return ("fork", pid, None)
    if event == "os.system":
        return ("x", "os.system", f"it ran `{_text(args[0])}` through os.system: a shell "
                "resolves and reads what it runs itself, which no audit hook sees")
    return None


def named_files(event: str, args: tuple[Any, ...], env: Mapping[str, str],
                ) -> tuple[str | None, list[str]]:
    """The executable a start runs (resolved on ``PATH``; None when not found) and the
    arguments that name existing files (absolute; relative ones against the working
    folder the child gets)."""
    if event == "subprocess.Popen":  # (executable, args, cwd, env)
        argv, exe, cwd = _argv(args[1]), args[0], args[2]
    elif event in ("os.posix_spawn", "os.exec"):  # (path, argv, env)
        argv, exe, cwd = _argv(args[1]), args[0], None
    elif event == "os.spawn":  # (mode, path, args, env)
        argv, exe, cwd = _argv(args[2]), args[1], None
    else:
        return None, []
    base = _text(cwd) if cwd is not None else os.getcwd()
    program = _text(exe) if exe is not None else (argv[0] if argv else "")
    where = program if os.sep in program else (
        shutil.which(program, path=env.get("PATH", os.defpath)) if program else None)
    found: list[str] = []
    for arg in argv[1:]:
        if not arg or arg.startswith("-"):
            continue
        path = os.path.normpath(os.path.join(base, arg))
        if os.path.isfile(path):
            found.append(path)
    return (os.path.normpath(os.path.join(base, where)) if where else None), found


def follow_environment(folder: str, skip: Sequence[str], import_root: str,
                       env: Mapping[str, str]) -> dict[str, str]:
    """The variables a cell's children inherit so that a Python child follows itself:
    the log folder, the skip folders, and ``PYTHONPATH`` with ``follow_site`` first and
    the folder holding cpmatrix after the cell's own entries.

    >>> e = follow_environment("/w/f", ["/out"], "/src", {"PYTHONPATH": "/p"})
    >>> e["PYTHONPATH"].split(":")[1:], e[FOLLOW_ENV], json.loads(e[SKIP_ENV])
    (['/p', '/src'], '/w/f', ['/out'])
    """
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = [SITE_DIR, *(p for p in path if p != SITE_DIR)]
    if import_root not in path:
        path.append(import_root)
    return {FOLLOW_ENV: folder, SKIP_ENV: json.dumps(list(skip)),
            "PYTHONPATH": os.pathsep.join(path)}


class ChildLog:
    """The log a followed process appends to: a header, then one JSON line per read
    (``r``), start (``e``) or unobservable start (``x``); ``final`` at a clean exit."""

    def __init__(self, folder: str, *, forked: bool) -> None:
        self.folder = folder
        name = f"{os.getpid()}-{os.urandom(4).hex()}.jsonl"
        self.file: TextIO = open(os.path.join(folder, name), "a",  # noqa: SIM115
                                 buffering=1, encoding="utf-8")
        self.line({"pid": os.getpid(), "ppid": os.getppid(), "forked": forked,
                   "argv": list(sys.orig_argv)})

    def line(self, record: Mapping[str, Any]) -> None:
        try:
            self.file.write(json.dumps(record) + "\n")
        except (OSError, ValueError):  # a closed or full log: the start goes unmatched
            pass


def merge_signatures(a: str, b: str) -> str:
    """One signature for a path two processes of a cell saw: an unobservable start wins,
    then a listed folder over the same folder seen as an import folder (every name
    counts), and two different contents are ``CHANGED``.

    >>> merge_signatures("f:1", "f:1"), merge_signatures("f:1", "f:2")
    ('f:1', '!')
    >>> merge_signatures("p:9:1", "d:9:1"), merge_signatures("f:1", "?why")
    ('d:9:1', '?why')
    """
    if a == b:
        return a
    for sig in (a, b):
        if sig.startswith(UNOBSERVED):
            return sig
    if {a[:1], b[:1]} == {"d", "p"} and a[1:] == b[1:]:
        return "d" + a[1:]
    return CHANGED


def unfollowed(starts: Sequence[Expectation]) -> dict[str, str]:
    """Starts made where no child can log (an observer without a follow folder): each
    makes the cell unobservable.

    >>> unfollowed([("spawn", 1, ["ls"])])
    {'start:`ls`': 'it started `ls`, and this process does not follow the processes it starts'}
    """
    out: dict[str, str] = {}
    for kind, key, argv in starts:
        if kind == "x":
            out[str(key)] = str(argv)
        else:
            what = "a forked child" if kind == "fork" else describe(argv or ["?"])
            out[f"start:{what}"] = (f"it started {what}, and this process does not "
                                    "follow the processes it starts")
    return out


def _parse(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    lines = text.split("\n")[:-1]  # a last line without its newline is being written
    try:
        header = json.loads(lines[0])
        records = [json.loads(x) for x in lines[1:]]
    except (IndexError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    proc: dict[str, Any] = {"header": header, "reads": {}, "expect": [], "final": None}
    for r in records:
        if not isinstance(r, dict):
            continue
        if "r" in r:
            proc["reads"].setdefault(r["r"][0], r["r"][1])
        elif "e" in r:
            proc["expect"].append(tuple(r["e"]))
        elif "final" in r:
            proc["final"] = r["final"]
    return proc


def _matches(kind: str, pid: Any, argv: Any, header: Mapping[str, Any]) -> bool:
    if kind == "fork":
        return bool(header.get("forked")) and header.get("ppid") == pid
    if header.get("forked") or header.get("argv") != argv:
        return False
    return bool(header.get("ppid" if kind == "spawn" else "pid") == pid)


def collect(folder: str, own: Sequence[Expectation],
            ) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The observed sets of every process logged in ``folder`` and the starts nobody
    answered (key -> reason), for the starts ``own`` (the rank's) and those each logged
    process made."""
    procs = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    for name in names:
        proc = _parse(os.path.join(folder, name))
        if proc is not None:
            procs.append(proc)
    used: set[int] = set()
    unanswered: dict[str, str] = {}
    pending = [*own, *(e for p in procs for e in p["expect"])]
    for kind, pid, argv in pending:
        if kind == "x":
            unanswered.setdefault(str(pid), str(argv))
            continue
        hit = next((i for i, p in enumerate(procs)
                    if i not in used and _matches(kind, pid, argv, p["header"])), None)
        if hit is not None:
            used.add(hit)
            continue
        what = "a forked child" if kind == "fork" else describe(argv or ["?"])
        unanswered.setdefault(
            f"start:{what}",
            f"it started {what}, which reported no reads: only a Python child that "
            f"inherits the cell's environment ({FOLLOW_ENV}, PYTHONPATH) is followed; a "
            "native program's (or a shell's) own reads are invisible to an audit hook")
    sets = []
    for p in procs:
        reads = dict(p["reads"])
        if isinstance(p["final"], dict):
            reads.update(p["final"])
        sets.append(reads)
    return sets, unanswered


def enter_follow(root: str, skip: Sequence[str]) -> tuple[str, dict[str, str | None]]:
    """A fresh log folder for one cell's children under ``root``, announced in the
    environment they inherit; the folder and the variables it replaced."""
    os.makedirs(root, exist_ok=True)
    folder = os.path.join(root, f"{os.getpid()}-{os.urandom(4).hex()}")
    os.mkdir(folder)
    env = follow_environment(folder, skip, str(IMPORT_ROOT), os.environ)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return folder, saved


def leave_follow(saved: Mapping[str, str | None]) -> None:
    """Put back the variables :func:`enter_follow` replaced."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def add_children(observed: dict[str, str], folder: str,
                 starts: Sequence[Expectation]) -> None:
    """Merge what the cell's followed children (logged in ``folder``) read into its
    ``observed`` set; a start nobody answered makes the cell unobservable (``?`` and
    why). ``folder`` "": nothing followed, every start is unanswered."""
    if not folder:
        unanswered = unfollowed(starts)
    else:
        sets, unanswered = collect(folder, starts)
        shutil.rmtree(folder, ignore_errors=True)
        for reads in sets:
            for path, sig in reads.items():
                observed[path] = merge_signatures(observed.setdefault(path, sig), sig)
    for key, why in unanswered.items():
        observed[key] = UNOBSERVED + why
