"""The interpreter that runs the worlds, as the result cache's key sees it.

Like Bazel's action key covers the toolchain, a cached PASS is reused only under the
same interpreter (its real path and version) and the same installed distributions
(every ``name==version`` that ``importlib.metadata`` lists). They are read once per run,
in a subprocess of ``--python``: the interpreter the ranks use, not the one running
cpmatrix. A venv with another torch (or any other package) gets other keys.

Example::

    >>> ident = interpreter_identity(sys.executable)              # doctest: +SKIP
    >>> sorted(ident)                                              # doctest: +SKIP
    ['distributions', 'executable', 'packages', 'version']
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from cpmatrix.errors import UsageError

__all__ = ["interpreter_identity"]

_PROBE = """\
import importlib.metadata as md, json, os, sys
dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in md.distributions()
                if d.metadata['Name']})
print(json.dumps({"executable": os.path.realpath(sys.executable), "version": sys.version,
                  "dists": dists}))
"""


def interpreter_identity(python: str = sys.executable) -> dict[str, str]:
    """``executable``, ``version``, ``packages`` (count) and ``distributions`` (sha256).

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
    }
