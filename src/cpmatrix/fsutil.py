"""Atomic file writes: a reader never sees a half-written file. Standard library only.

Files get the mode a plain ``open()`` would give them (``0666 & ~umask``), not the
``0600`` of ``mkstemp``: reports are read by other users and CI upload steps. JSON is
strict: ``inf``/``nan`` (which ``json`` would write as the non-standard ``Infinity``)
are written as the strings ``"inf"``, ``"-inf"``, ``"nan"``.

Example::

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> atomic_write_json(os.path.join(d, "x.json"), {"a": 1, "b": float("inf")})
    >>> read_json(os.path.join(d, "x.json"))
    {'a': 1, 'b': 'inf'}
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_write_text", "json_safe",
           "read_json", "read_segment", "tail_lines"]


def _umask() -> int:
    """The process umask, read without changing it (Linux), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a temp file in the same folder, then ``os.replace`` it into place."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
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


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``"inf"``, ``"-inf"`` or ``"nan"``.

    >>> json_safe({"a": [1.0, float("-inf")], "b": float("nan")})
    {'a': [1.0, '-inf'], 'b': 'nan'}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def atomic_write_json(path: str | os.PathLike[str], value: Any) -> None:
    """Strict JSON (see :func:`json_safe`), written atomically."""
    atomic_write_text(path, json.dumps(json_safe(value), indent=1, default=str,
                                       allow_nan=False))


def _read_range(path: str | os.PathLike[str], start: int, end: int | None) -> bytes:
    """The bytes ``[start:end]`` of a file (``end`` None: to its end); b'' if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read() if end is None else f.read(max(0, end - start))
    except OSError:
        return b""


def tail_lines(path: str | os.PathLike[str], start: int = 0, end: int | None = None,
               lines: int = 30) -> str:
    """The last ``lines`` lines of the bytes ``[start:end]`` of a log ('' if unreadable)."""
    text = _read_range(path, start, end).decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def read_segment(path: str | os.PathLike[str], start: int = 0, end: int | None = None,
                 cap: int = 1 << 16) -> str:
    """The bytes ``[start:end]`` of a log as text, at most the last ``cap`` of them (a
    first line says how many were cut); '' if unreadable.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
    ...     _ = f.write("a" * 10 + "bcd")
    >>> read_segment(f.name, 10), read_segment(f.name, 0, 12, cap=3)
    ('bcd', '[... 9 bytes cut]\\nabc')
    """
    data = _read_range(path, start, end)
    cut = len(data) - cap
    text = data[-cap:].decode("utf-8", errors="replace") if cut > 0 else \
        data.decode("utf-8", errors="replace")
    return f"[... {cut} bytes cut]\n{text}" if cut > 0 else text


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
