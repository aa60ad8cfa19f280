"""The interpreter that runs the worlds, as the result cache's key sees it.

Like Bazel's action key covers the toolchain, a cached PASS is reused only under the
same interpreter (the sha256 of its binary and its ``sys.version``), the same installed
distributions (every ``name==version`` that ``importlib.metadata`` lists) and the same
site configuration (its ``sys.path`` and every ``.pth`` file on it, by content: a
``.pth`` edited to point at another folder, or running other code at start-up, changes
where imports come from before any cell runs, which the observed set cannot see). They
are read once per run, in a subprocess of ``--python``: the interpreter the ranks use,
not the one running cpmatrix. A venv with another torch (or any other package) gets
other keys.

**Location independence** (docs/cache.md): the key names no folder of this machine.
The interpreter is its binary's content, not its path; in ``sys.path`` and in the
``.pth`` files, the project's folder and the interpreter's prefix (a venv's folder) are
written as ``$project`` and ``$prefix`` (:class:`~cpmatrix.cache.portable.Anchors`), so
the same venv layout in another checkout, or on another machine, gives the same key.
Where those folders lead is checked by content in each cell's observed set.

Example::

    >>> probe = probe_interpreter(sys.executable)                     # doctest: +SKIP
    >>> sorted(probe.identity(probe.anchors("/path/to/project")))      # doctest: +SKIP
    ['distributions', 'interpreter', 'packages', 'site', 'version']
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from cpmatrix.cache.portable import Anchors
from cpmatrix.errors import UsageError

__all__ = ["Interpreter", "interpreter_identity", "probe_interpreter"]

_PROBE = """\
import hashlib, importlib.metadata as md, json, os, sys
dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in md.distributions()
                if d.metadata['Name']})
pth = []
for entry in sys.path:
    try:
        names = sorted(n for n in os.listdir(entry) if n.endswith(".pth"))
    except OSError:
        continue
    for name in names:
        try:
            with open(os.path.join(entry, name), "rb") as f:
                pth.append([entry, name, f.read().decode("utf-8", "surrogateescape")])
        except OSError:
            pth.append([entry, name, None])
with open(os.path.realpath(sys.executable), "rb") as f:
    binary = hashlib.file_digest(f, hashlib.sha256).hexdigest()
print(json.dumps({"binary": binary, "version": sys.version, "prefix": sys.prefix,
                  "dists": dists, "path": sys.path, "pth": pth}))
"""


@dataclass(frozen=True, slots=True)
class Interpreter:
    """What the probe of ``--python`` found (raw: folders as absolute paths)."""

    binary: str
    version: str
    prefix: str
    dists: tuple[str, ...]
    path: tuple[str, ...]
    #: ``(sys.path entry, file name, content or None when unreadable)`` of each ``.pth``.
    pth: tuple[tuple[str, str, str | None], ...]

    def anchors(self, project: str) -> Anchors:
        """The roots this run's paths are written against: the project and the prefix."""
        return Anchors.of(project=project, prefix=self.prefix)

    def identity(self, anchors: Anchors) -> dict[str, str]:
        """``interpreter`` (sha256 of the binary), ``version``, ``packages`` (count),
        ``distributions`` (sha256) and ``site`` (sha256 of ``sys.path`` and the ``.pth``
        files on it, folders written against ``anchors``)."""
        site = hashlib.sha256(json.dumps([anchors.portable(p) for p in self.path]).encode())
        for entry, name, content in self.pth:
            site.update(f"\0{anchors.portable(entry)}/{name}\0".encode())
            site.update(b"unreadable" if content is None else
                        anchors.text(content).encode("utf-8", "surrogateescape"))
        return {
            "interpreter": f"sha256:{self.binary}",
            "version": self.version,
            "packages": str(len(self.dists)),
            "distributions": hashlib.sha256("\n".join(self.dists).encode()).hexdigest(),
            "site": site.hexdigest(),
        }


def probe_interpreter(python: str = sys.executable) -> Interpreter:
    """Run the probe in ``python``; :class:`UsageError` (exit 2) naming ``--python`` when
    it cannot be run."""
    try:
        proc = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: cannot run it: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--python {python}: cannot run it (exit {proc.returncode}): {tail}")
    try:
        data: Any = json.loads(proc.stdout.strip().splitlines()[-1])
        return Interpreter(
            binary=str(data["binary"]), version=str(data["version"]),
            prefix=str(data["prefix"]), dists=tuple(map(str, data["dists"])),
            path=tuple(map(str, data["path"])),
            pth=tuple((str(e), str(n), None if c is None else str(c))
                      for e, n, c in data["pth"]))
    except (ValueError, IndexError, KeyError, TypeError):
        raise UsageError(f"--python {python}: unexpected output {proc.stdout[:200]!r}") from None


def interpreter_identity(python: str = sys.executable, *, project: str = "",
                         ) -> dict[str, str]:
    """The toolchain part of the key for ``python``, folders written relative to
    ``project`` and the interpreter's prefix (see :meth:`Interpreter.identity`)."""
    probe = probe_interpreter(python)
    return probe.identity(probe.anchors(project))
