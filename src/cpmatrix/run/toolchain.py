"""The interpreter that runs the worlds, as the result cache's key sees it.

Like Bazel's action key covers the toolchain, a cached PASS is reused only under the
same interpreter (its real path and version), the same installed distributions (every
``name==version`` that ``importlib.metadata`` lists) and the same site configuration
(its ``sys.path`` and every ``.pth`` file on it, by content: a ``.pth`` edited to point
at another folder, or running other code at start-up, changes where imports come from
before any cell runs, which the observed set cannot see). They are read once per run,
in a subprocess of ``--python``: the interpreter the ranks use, not the one running
cpmatrix. A venv with another torch (or any other package) gets other keys.

Example::

    >>> ident = interpreter_identity(sys.executable)              # doctest: +SKIP
    >>> sorted(ident)                                              # doctest: +SKIP
    ['distributions', 'executable', 'packages', 'site', 'version']
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from cpmatrix.errors import UsageError

__all__ = ["interpreter_identity"]

_PROBE = """\
import hashlib, importlib.metadata as md, json, os, sys
dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in md.distributions()
                if d.metadata['Name']})
site = hashlib.sha256(json.dumps(sys.path).encode())
for entry in sys.path:
    try:
        names = sorted(n for n in os.listdir(entry) if n.endswith(".pth"))
    except OSError:
        continue
    for name in names:
        try:
            with open(os.path.join(entry, name), "rb") as f:
                site.update(f"\\0{entry}/{name}\\0".encode() + f.read())
        except OSError:
            site.update(f"\\0{entry}/{name}\\0unreadable".encode())
print(json.dumps({"executable": os.path.realpath(sys.executable), "version": sys.version,
                  "dists": dists, "site": site.hexdigest()}))
"""


def interpreter_identity(python: str = sys.executable) -> dict[str, str]:
    """``executable``, ``version``, ``packages`` (count), ``distributions`` (sha256) and
    ``site`` (sha256 of ``sys.path`` and the ``.pth`` files on it).

    Raises :class:`UsageError` (exit 2) naming ``--python`` when it cannot be run.
    """
    try:
        proc = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: cannot run it: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--python {python}: cannot run it (exit {proc.returncode}): {tail}")
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UsageError(f"--python {python}: unexpected output {proc.stdout[:200]!r}") from None
    dists = "\n".join(data["dists"])
    return {
        "executable": str(data["executable"]),
        "version": str(data["version"]),
        "packages": str(len(data["dists"])),
        "distributions": hashlib.sha256(dists.encode()).hexdigest(),
        "site": str(data["site"]),
    }
