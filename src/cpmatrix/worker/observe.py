"""What a cell read, observed inside each rank: the completion of the cache's action key.

Standard library only; it runs in the ranks (:mod:`~cpmatrix.worker.world_main`) and in
the compile job (:mod:`~cpmatrix.worker.compile_main`).

A :class:`ReadObserver` is switched on for one cell (:meth:`~ReadObserver.start`, before
the case module is imported) and off after it (:meth:`~ReadObserver.stop`), which returns
the cell's **observed set**: every file and folder the cell depended on, each with its
*signature* (:func:`signature`: kind, size, mtime, ctime and inode as the rank saw them).
The supervisor hashes each one (checking the signature first, so a file edited while the
run read it is never stored as what ran) and stores the hashes in the cache entry;
a lookup re-hashes them, and any change reruns the cell (:mod:`cpmatrix.cache.key`).

What is observed:

- **files opened for reading** during the cell (``sys.addaudithook``'s ``open`` event:
  ``open``, ``io.open``, ``os.open``, ``io.open_code`` and so every import, whatever did it:
  ``importlib``, a folder added to ``sys.path``, a ``.pth`` path, ``runpy``). A byte-code
  file stands for its source (``__pycache__/m.cpython-311.pyc`` -> ``m.py``). A file that
  does not exist is observed as absent (a later run that finds it reruns). A file the
  cell itself created or truncated before reading it is its own output, not an input.
- **everything read in this process before**: every module in ``sys.modules`` (its file,
  with the signature it had when first seen) and every file an earlier cell of this rank
  read, minus the files of modules since dropped from ``sys.modules`` (the project's
  modules, which the isolation drops after each cell and the next cell imports afresh).
  A module imported before the cell, by the world or by an earlier cell, is code the
  cell may run though its import raises no event; a module loaded by path and never
  registered, or a module-level cache of a data file, may still be used. This is a
  superset of what the cell used, chosen because it can only cause an extra rerun,
  never a false cached pass.
- **folders**: those the cell listed (``os.listdir``/``os.scandir``: a glob over a data
  folder; kind ``d``, every name counts), and every folder imports search (each
  ``sys.path`` entry and each loaded package's ``__path__``; kind ``p``, only names that
  could be imported count), so a module *added* where an import would find it reruns
  the cell too.

- **processes the cell starts** (:mod:`cpmatrix.worker.follow`): their executable and the
  files their arguments name; a Python child observes its own reads into a log the rank
  merges; a start nobody answered (a native program, a shell) makes the cell
  unobservable (a ``?`` signature with the reason: never stored).

What is not observed (each is covered elsewhere or is a documented limit, docs/cache.md):
the interpreter's standard library; files listed in the ``RECORD`` of a non-editable
installed distribution (covered by its ``name==version`` in the toolchain key); the run's
own output folder (``skip``); ``/proc``, ``/sys``, ``/dev``; files opened by native code
(C, C++, Rust) rather than through Python; files only ``stat``-ed.

An audit hook cannot be removed, so one hook is installed per process, on the first
:class:`ReadObserver`, and does nothing but return while no cell is recorded (about a
microsecond per audit event). What is decided once per process (the RECORDs, the modules
loaded so far) is done by :func:`warm`, which the rank module calls at import: the fork
launcher imports it before it forks, so all of a world's ranks share that work.

Example::

    >>> obs = ReadObserver(skip=())
    >>> obs.start()
    >>> with open(__file__, encoding="utf-8") as f:
    ...     _ = f.read(1)
    >>> reads = obs.stop()
    >>> reads[__file__].startswith("f:")
    True
"""

from __future__ import annotations

import atexit
import json
import os
import stat
import sys
import weakref
from collections.abc import Callable, Sequence
from importlib.machinery import all_suffixes
from importlib.util import source_from_cache
from typing import Any

from cpmatrix.worker.classify import Classifier
from cpmatrix.worker.follow import (
    CHANGED,
    FOLLOW_ENV,
    SKIP_ENV,
    STARTS,
    ChildLog,
    add_children,
    enter_follow,
    expectation,
    leave_follow,
    named_files,
)

__all__ = ["ABSENT", "CHANGED", "IMPORTABLE_SUFFIXES", "ReadObserver", "child_main",
           "importable", "signature", "warm"]

#: The signature of a path that does not exist.
ABSENT = "-"
#: File suffixes an import can load (``.py``, ``.pyc``, extension modules), and ``.pth``.
IMPORTABLE_SUFFIXES = (*all_suffixes(), ".pth")


def signature(path: str) -> str:
    """``f:size:mtime_ns:ctime_ns:inode`` for a file, ``d:...`` for a folder, ``-`` absent.

    Equal signatures mean an unchanged file (ctime moves on every write, even one that
    puts the old mtime back).

    >>> signature("/no/such/file")
    '-'
    >>> signature("/").startswith("d:")
    True
    """
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return ABSENT
    kind = "d" if stat.S_ISDIR(st.st_mode) else "f"
    return f"{kind}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def importable(name: str) -> bool:
    """Whether a folder entry named ``name`` could be found by an import (or is a ``.pth``).

    >>> [n for n in ("a.py", "pkg", "m.cpython-311-x86_64-linux-gnu.so", "x.pth",
    ...              "data.csv", "__pycache__", ".hidden", "my-dist-1.0.dist-info")
    ...  if importable(n)]
    ['a.py', 'pkg', 'm.cpython-311-x86_64-linux-gnu.so', 'x.pth']
    """
    if name == "__pycache__" or name.startswith("."):
        return False
    stem, dot, _ = name.partition(".")
    if not stem.isidentifier():
        return False
    return not dot or name.endswith(IMPORTABLE_SUFFIXES)


#: Made once per process (:func:`warm`): the classifier and, per loaded module, (a weak
#: reference to it, its observed file or "", the file's signature when first seen, its
#: observed package folders).
_CLASSIFIER: Classifier | None = None
_MODULES: dict[str, tuple[Any, str, str, tuple[str, ...]]] = {}


def warm() -> Classifier:
    """Read the RECORDs and look at every module loaded so far, once per process.

    The fork launcher imports the rank's module before it forks; a call there does the
    work once for all of its ranks (about a tenth of a second for torch's ~30,000 RECORD
    lines and ~2,000 modules).
    """
    global _CLASSIFIER
    if _CLASSIFIER is None:
        _CLASSIFIER = Classifier()
        _scan(_MODULES, _CLASSIFIER.observed, {})
    return _CLASSIFIER


def _absolute(path: Any) -> str | None:
    """``path`` of an audit event as an absolute, normalized ``str`` (None for an fd)."""
    if path is None:
        return os.getcwd()
    if isinstance(path, int):
        return None
    try:
        text = os.fsdecode(os.fspath(path))
    except (TypeError, ValueError):
        return None
    return os.path.normpath(text if text.startswith(os.sep) else os.path.join(os.getcwd(), text))


class ReadObserver:
    """Records, per cell, what the cell read (see the module docstring).

    ``skip``: folders never observed (the run's output folder: a cell's own files).
    ``follow``: a folder (inside ``skip``) where each cell's followed children log what
    they read (:mod:`cpmatrix.worker.follow`); without it, a cell that starts a process
    is unobservable. ``trust_installed``: a start of an executable listed in a
    distribution's RECORD is not followed (the compile job's ``ptxas``, whose binary
    is in the toolchain key and whose one input is the PTX the job wrote itself).
    """

    _hook_installed = False
    _current: ReadObserver | None = None

    def __init__(self, skip: Sequence[str], *, follow: str = "",
                 trust_installed: bool = False) -> None:
        self.classifier = warm()
        self.skip = tuple(p.rstrip(os.sep) + os.sep for p in skip if p)
        self.follow = follow
        self.trust_installed = trust_installed
        #: This cell's children's log folder, and the environment it replaced.
        self.follow_dir = ""
        self.saved_env: dict[str, str | None] = {}
        #: The starts this process made during the cell (:func:`follow.expectation`).
        self.expect: list[tuple[str, Any, Any]] = []
        #: In a followed process: the log each read and start is appended to.
        self.log: ChildLog | None = None
        self.active = False
        #: Why the observer failed during this cell ("" while it did not).
        self.failed = ""
        #: path -> signature at first read in this cell (``d`` for a listed folder).
        self.reads: dict[str, str] = {}
        #: Files the cell created or truncated before reading them (its own output).
        self.produced: set[str] = set()
        #: Everything read in this process so far (path -> first signature), minus the
        #: files of modules since dropped from ``sys.modules``: every cell depends on it
        #: (a module-level cache of a data file, a module loaded without being
        #: registered, a module an earlier cell imported: all still there).
        self.seen: dict[str, str] = {}
        ReadObserver._current = self
        if not ReadObserver._hook_installed:
            sys.addaudithook(_dispatch)
            os.register_at_fork(after_in_child=_after_fork)
            ReadObserver._hook_installed = True
        # Modules loaded before the first cell (the world's own imports): their
        # signature when first seen is the nearest to their load time one can know.
        self.seen.update(self._scan_modules({})[0])

    def observed(self, path: str) -> bool:
        """Whether ``path`` is observed: outside ``skip``, the stdlib and the RECORDs."""
        return not (path + os.sep).startswith(self.skip) and self.classifier.observed(path)

    # ------------------------------------------------------------------ per cell
    def start(self) -> None:
        """Start recording a cell (before its case module is imported)."""
        self.reads = {}
        self.produced = set()
        self.failed = ""
        self.expect = []
        if self.follow and self.log is None:
            self.follow_dir, self.saved_env = enter_follow(
                self.follow, [p.rstrip(os.sep) for p in self.skip])
        self.active = True

    def log_to(self, log: ChildLog) -> None:
        """Record this (followed) process into ``log`` from now on."""
        self.log = log
        self.start()

    def finish_log(self) -> None:
        """At a followed process's clean exit: its whole observed set, once more."""
        if self.log is not None and self.active:
            self.active = False
            self.log.line({"final": self._observed()})

    def _record(self, path: str, sig: str) -> None:
        self.reads[path] = sig
        if self.log is not None:
            self.log.line({"r": [path, sig]})

    def stop(self) -> dict[str, str] | None:
        """Stop recording; the cell's observed set (path -> signature), or None when the
        observer failed during the cell (the cell then is never cached)."""
        self.active = False
        leave_follow(self.saved_env)
        self.saved_env = {}
        try:
            observed = self._observed()
            folder, self.follow_dir = self.follow_dir, ""
            add_children(observed, folder, self.expect)
        except Exception as exc:  # never let the observer fail a cell or a rank
            self.failed = self.failed or f"{type(exc).__name__}: {exc}"
        if self.failed:
            print(f"cpmatrix worker: what the cell read was not observed ({self.failed}); "
                  "its pass is not cached", file=sys.stderr)
            return None
        return observed

    def _observed(self) -> dict[str, str]:
        modules, packages, unloaded = self._scan_modules(self.reads)
        seen = self.seen
        for path in unloaded:
            seen.pop(path, None)
        observed: dict[str, str] = {}
        for path, sig in self.reads.items():
            first = seen.setdefault(path, sig)
            # Read before with another signature (a reload, or a file edited during
            # the run): what the cell depended on is not one file's content.
            observed[path] = sig if first == sig else CHANGED
        for path, sig in modules.items():
            seen.setdefault(path, sig)
        for path, sig in seen.items():
            observed.setdefault(path, sig)
        for folder in self._import_folders(packages):
            sig = signature(folder)
            if sig.startswith("d:"):
                # An import searches it: only importable names count (replaces a plain
                # listing the import system made of it during the cell).
                observed[folder] = "p" + sig[1:]
        return observed

    # ---------------------------------------------------------------- the hook
    def on_event(self, event: str, args: tuple[Any, ...]) -> None:
        """One audit event of the cell. Never raises (an exception in an audit hook
        would fail the case's own ``open``); a failure makes the cell unobserved."""
        try:
            self._on_event(event, args)
        except Exception as exc:
            self.failed = self.failed or f"{type(exc).__name__}: {exc}"

    def _on_event(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            self._on_open(*args[:3])
        elif event in ("os.listdir", "os.scandir"):
            path = _absolute(args[0] if args else None)
            if path is not None and path not in self.reads and self.observed(path):
                sig = signature(path)
                self._record(path, ("d" + sig[1:]) if sig.startswith("d:") else sig)
        else:
            self._on_start(event, args)

    def _on_start(self, event: str, args: tuple[Any, ...]) -> None:
        """A process start: its executable and the files its arguments name are read;
        the start itself must be answered by the log of the process it starts."""
        start = expectation(event, args, pid=os.getpid())
        if start is None:
            return
        exe, files = named_files(event, args, os.environ)
        if self.trust_installed and exe is not None and exe in self.classifier.record:
            return
        for path in ([exe] if exe else []) + files:
            if path not in self.reads and path not in self.produced and self.observed(path):
                self._record(path, signature(path))
        if self.log is not None:
            self.log.line({"e": list(start)})
        else:
            self.expect.append(start)

    def _on_open(self, path: Any, mode: Any = "r", flags: Any = 0) -> None:
        if not isinstance(path, str | bytes | os.PathLike):
            return
        full = _absolute(path)
        if full is None:
            return
        if isinstance(mode, str):
            reading = "r" in mode or "+" in mode
            truncating = "w" in mode or "x" in mode
        else:
            flags = flags if isinstance(flags, int) else 0
            reading = (flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)
            truncating = bool(flags & os.O_TRUNC) or bool(
                flags & os.O_CREAT and flags & os.O_EXCL)
        if full.endswith(".pyc") and f"{os.sep}__pycache__{os.sep}" in full:
            try:
                source = source_from_cache(full)
            except ValueError:
                source = full
            if os.path.exists(source):
                full = source  # the byte code of this source: the source is what counts
        if full in self.reads or not self.observed(full):
            return
        if truncating:
            self.produced.add(full)  # from here on its content is the cell's own output
        elif reading and full not in self.produced:
            self._record(full, signature(full))

    # ---------------------------------------------------------------- modules
    def _scan_modules(self, opened: dict[str, str],
                      ) -> tuple[dict[str, str], list[str], list[str]]:
        """The observed modules now loaded (file -> signature at load), the observed
        folders of the loaded packages (their ``__path__``), and the files of modules
        that left ``sys.modules`` since the last scan (unloaded: dropped between cells).
        """
        found, folders, unloaded = _scan(_MODULES, self.observed, opened)
        skip = self.skip
        if skip:  # a module first seen before this world knew its own folder
            found = {p: s for p, s in found.items() if not (p + os.sep).startswith(skip)}
        return found, folders, unloaded

    def _import_folders(self, packages: list[str]) -> list[str]:
        """Every folder an import searches: ``sys.path`` and the loaded packages'."""
        folders: dict[str, None] = {}
        for entry in sys.path:
            path = _absolute(entry or None)
            if path is not None and self.observed(path):
                folders[path] = None
        folders.update(dict.fromkeys(packages))
        return list(folders)


def _scan(known: dict[str, tuple[Any, str, str, tuple[str, ...]]],
          observed: Callable[[str], bool], opened: dict[str, str],
          ) -> tuple[dict[str, str], list[str], list[str]]:
    """Look at ``sys.modules`` (each module object once: a weak reference tells a
    re-imported module apart); see :meth:`ReadObserver._scan_modules`.

    A module's signature is the one its file had when first seen: when a recorded cell
    opened it (``opened``), else when the module was first found loaded (before the
    first cell: the world's own imports).
    """
    found: dict[str, str] = {}
    folders: dict[str, None] = {}
    for name, module in list(sys.modules.items()):
        hit = known.get(name)
        if hit is None or hit[0]() is not module:
            hit = _look(module, observed, opened)
            try:
                known[name] = (weakref.ref(module), *hit[1:])
            except TypeError:  # not a module object: looked at again next time
                pass
        if hit[1]:
            found[hit[1]] = hit[2]
        for folder in hit[3]:
            folders[folder] = None
    unloaded = []
    for name in [n for n in known if n not in sys.modules]:
        file = known.pop(name)[1]
        if file and file not in found:
            unloaded.append(file)
    return found, list(folders), unloaded


def _look(module: Any, observed: Callable[[str], bool], opened: dict[str, str],
          ) -> tuple[Any, str, str, tuple[str, ...]]:
    """``(None, file, signature, package folders)`` of a module not seen before."""
    file = _own(module, "__file__")
    path = _absolute(file) if isinstance(file, str) else None
    if path is None or not observed(path) or (
            not os.path.isabs(str(file)) and not os.path.exists(path)):
        path, sig = "", ""  # built in, not observed, or a made-up relative name
    else:
        sig = opened.get(path) or signature(path)
    paths = _own(module, "__path__")
    try:
        entries = list(paths) if paths is not None else []
    except Exception:  # an odd object in sys.modules
        entries = []
    folders = []
    for entry in entries:
        folder = _absolute(entry) if isinstance(entry, str) else None
        if folder is not None and observed(folder):
            folders.append(folder)
    return None, path, sig, tuple(folders)


def _own(module: Any, name: str) -> Any:
    """``module``'s own attribute ``name``, never through a module ``__getattr__`` (a lazy
    loader there would import modules while this observer only looks)."""
    try:
        return vars(module).get(name)
    except TypeError:
        return None


def _dispatch(event: str, args: tuple[Any, ...]) -> None:
    """The process's one audit hook: cheap while no cell is recorded."""
    observer = ReadObserver._current
    if observer is None or not observer.active:
        return
    # Nothing the observer does raises these events (no open, no listing, no start):
    # no re-entry.
    if event == "open" or event == "os.listdir" or event == "os.scandir" or \
            event in STARTS:
        observer.on_event(event, args)


def _after_fork() -> None:
    """In a forked child of a recorded cell: the inherited observer logs for the rank."""
    observer = ReadObserver._current
    if observer is not None and observer.active:
        observer.active = False  # opening the log raises an audit event
        folder = observer.log.folder if observer.log is not None else observer.follow_dir
        observer.follow_dir, observer.saved_env = "", {}
        observer.reads, observer.expect = {}, []
        if folder:  # else nobody to log to: the fork stays unanswered
            observer.log = ChildLog(folder, forked=True)
            observer.active = True


def child_main() -> None:
    """In a Python child of a cell (``follow_site/sitecustomize.py``): when the cell's
    environment asks for it (:mod:`cpmatrix.worker.follow`), observe this process's
    reads into a log of its own until it exits."""
    folder = os.environ.get(FOLLOW_ENV)
    if not folder or not os.path.isdir(folder):
        return
    try:
        skip = [str(s) for s in json.loads(os.environ.get(SKIP_ENV, "[]"))]
    except (ValueError, TypeError):
        skip = []
    observer = ReadObserver(skip=[*skip, folder])
    observer.log_to(ChildLog(folder, forked=False))
    atexit.register(observer.finish_log)
