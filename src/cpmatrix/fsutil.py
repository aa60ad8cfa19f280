"""Atomic file writes: a reader never sees a half-written file. Standard library only.

Example::

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> atomic_write_json(os.path.join(d, "x.json"), {"a": 1})
    >>> read_json(os.path.join(d, "x.json"))
    {'a': 1}
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_write_text", "read_json",
           "tail_lines"]


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a temp file in the same folder, then ``os.replace`` it into place."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=1, default=str))


def tail_lines(path: str | os.PathLike[str], start: int = 0, end: int | None = None,
               lines: int = 30) -> str:
    """The last ``lines`` lines of the bytes ``[start:end]`` of a log ('' if unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(max(0, end - start))
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
