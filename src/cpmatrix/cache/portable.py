"""Location-independent paths for cache keys and entries: a checkout anywhere can hit.

A cache entry names the files a cell read, and the toolchain's key names the
interpreter's ``sys.path`` and ``.pth`` files. As absolute paths, an entry stored from
``/home/ci/work/proj`` could never be reused from ``/home/dev/proj``, though every byte
the cell read is the same. :class:`Anchors` writes a path under one of a few **roots**
as a token plus the rest (``$project/cases/ring.py``), and reads it back against this
machine's roots. The content check stays exact: a lookup re-hashes
``<this project>/cases/ring.py`` and reuses the pass only when its bytes are the ones
stored (docs/cache.md, "Location independence").

The roots (longest first, so a venv inside the project is ``$prefix``):

- ``$project``: the git work tree holding the matrix file (else the matrix's folder);
- ``$prefix``: ``sys.prefix`` of the interpreter that runs the worlds (a venv's folder).

A path under no root stays absolute (``/usr/lib/python3/dist-packages/...``: the same
place on every machine). A root of ``/`` is never used (it would anchor everything).

Example::

    >>> a = Anchors.of(project="/home/ci/proj", prefix="/home/ci/proj/.venv")
    >>> a.portable("/home/ci/proj/cases/ring.py"), a.portable("/home/ci/proj/.venv/lib")
    ('$project/cases/ring.py', '$prefix/lib')
    >>> a.portable("/home/ci/project2/x"), a.portable("/home/ci/proj")
    ('/home/ci/project2/x', '$project')
    >>> b = Anchors.of(project="/tmp/other", prefix="/opt/venv")
    >>> b.local("$project/cases/ring.py"), b.local("$prefix/lib"), b.local("/usr/x")
    ('/tmp/other/cases/ring.py', '/opt/venv/lib', '/usr/x')
    >>> a.text("import _x; _x.install('/home/ci/proj/src')\\n/home/ci/proj2")
    "import _x; _x.install('$project/src')\\n/home/ci/proj2"
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NO_ANCHORS", "Anchors", "project_root"]


@dataclass(frozen=True, slots=True)
class Anchors:
    """Roots, longest first: ``(token, absolute folder)``."""

    roots: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, **roots: str) -> Anchors:
        """``Anchors.of(project=..., prefix=...)``: tokens ``$project``, ``$prefix``."""
        kept = [(f"${name}", os.path.normpath(path)) for name, path in roots.items()
                if path and os.path.isabs(path) and os.path.normpath(path) != os.sep]
        return cls(tuple(sorted(kept, key=lambda r: -len(r[1]))))

    def portable(self, path: str) -> str:
        """``path`` with its longest root written as a token (unchanged under none)."""
        for token, root in self.roots:
            if path == root or path.startswith(root + os.sep):
                return token + path[len(root):]
        return path

    def local(self, path: str) -> str:
        """A portable path as a path on this machine (an absolute path is unchanged; a
        token this machine has no root for stays as it is, so it names nothing)."""
        if not path.startswith("$"):
            return path
        for token, root in self.roots:
            if path == token or path.startswith(token + os.sep):
                return root + path[len(token):]
        return path

    def text(self, text: str) -> str:
        """Every root inside ``text`` (a ``.pth`` file, ``PATH``) written as its token,
        where it is a whole path component (``/a/proj`` is not a root of ``/a/proj2``)."""
        for token, root in self.roots:
            # (a token holds no backslash, the one character a replacement string escapes)
            text = re.sub(re.escape(root) + r"(?=$|[/\\\s'\":;,)\]])", token, text,
                          flags=re.MULTILINE)
        return text


#: No roots: every path is absolute (the behaviour before location independence).
NO_ANCHORS = Anchors()


def project_root(matrix_path: str | os.PathLike[str]) -> str:
    """The git work tree holding the matrix file, else the matrix file's folder."""
    folder = Path(matrix_path).resolve().parent
    try:
        proc = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return str(folder)
    top = proc.stdout.strip()
    return str(Path(top).resolve()) if proc.returncode == 0 and top else str(folder)
