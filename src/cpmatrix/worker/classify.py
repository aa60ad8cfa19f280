"""What the read observer leaves out: the standard library and the files of non-editable
installed distributions (their ``RECORD``; covered by ``name==version`` in the toolchain
key), and the kernel's views (``/proc``, ``/sys``, ``/dev``). Standard library only; made
once per process (:func:`cpmatrix.worker.observe.warm`).

Example::

    >>> Classifier().observed("/proc/self/status")
    False
"""

from __future__ import annotations

import csv
import json
import os
import sys
import sysconfig
from collections.abc import Iterable

__all__ = ["Classifier", "record_files"]

#: Never observed: the kernel's views, not files a cell's verdict can depend on.
_SYSTEM = ("/proc/", "/sys/", "/dev/")


def record_files(entries: Iterable[str]) -> frozenset[str]:
    """Every file listed in the ``RECORD`` of a non-editable distribution on ``entries``.

    Read with plain string operations (importlib.metadata's objects cost seconds for
    torch's ~30,000 lines); paths outside the folder (``../../bin/x``) are skipped.
    """
    files: set[str] = set()
    for entry in dict.fromkeys(entries):
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            info = os.path.join(entry, name)
            try:
                with open(os.path.join(info, "direct_url.json"), encoding="utf-8") as f:
                    url = json.load(f)
            except (OSError, ValueError):
                url = {}
            dir_info = url.get("dir_info") if isinstance(url, dict) else None
            if isinstance(dir_info, dict) and dir_info.get("editable"):
                continue  # PEP 610: an editable install, whose sources are observed
            try:
                with open(os.path.join(info, "RECORD"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            base = entry + os.sep
            for line in text.splitlines():
                if not line or line.startswith(".."):
                    continue
                if line.startswith('"'):  # a quoted path (it holds a comma)
                    line = next(csv.reader([line]))[0]
                    files.add(os.path.normpath(base + line))
                else:
                    files.add(base + line.partition(",")[0])
    return frozenset(files)


class Classifier:
    """Decides once per path whether it is outside the standard library and the RECORDs
    (the part that does not depend on a world: made once per process, see :func:`warm`)."""

    def __init__(self) -> None:
        base = sysconfig.get_paths(vars={"base": sys.base_prefix,
                                         "platbase": sys.base_exec_prefix})
        stdlib = {base["stdlib"], base["platstdlib"]}
        stdlib |= {os.path.realpath(p) for p in stdlib}
        version = f"python{sys.version_info[0]}{sys.version_info[1]}.zip"
        self.zips = (os.path.join(sys.base_prefix, "lib", version),
                     os.path.join(sys.base_exec_prefix, "lib", version))
        self.stdlib = tuple(p.rstrip(os.sep) + os.sep for p in stdlib)
        #: Site folders live under the stdlib folder in a plain (non-venv) install:
        #: what is below them is not the standard library.
        sites = {p for p in sys.path if os.path.basename(p) in ("site-packages",
                                                                 "dist-packages")}
        sites |= {os.path.realpath(p) for p in sites}
        self.sites = tuple(p.rstrip(os.sep) + os.sep for p in sites)
        self.record = record_files(os.path.abspath(p) for p in sys.path if p)
        self.memo: dict[str, bool] = {}

    def observed(self, path: str) -> bool:
        hit = self.memo.get(path)
        if hit is not None:
            return hit
        inside = path + os.sep  # a folder itself is inside its own prefix
        if inside.startswith(_SYSTEM) or path in self.zips or path in self.record or (
                inside.startswith(self.stdlib) and not inside.startswith(self.sites)):
            verdict = False
        else:
            # A package folder of a distribution (its __init__ is in the RECORD).
            verdict = os.path.join(path, "__init__.py") not in self.record
        self.memo[path] = verdict
        return verdict
