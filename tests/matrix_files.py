"""Shared by the loader and expansion tests: a matrix file beside a tiny case module."""

from __future__ import annotations

from pathlib import Path

#: The head of a one-platform matrix whose cases live in ``cases/`` beside it.
HEAD = """\
version: 1
pythonpath: [cases]
platforms:
  cpu: {backend: gloo, device: cpu}
"""


def write_matrix(tmp_path: Path, text: str) -> Path:
    """``text`` as ``tmp_path/m.yaml``, with ``cases/tiny.py`` (``tiny:ok``) beside it."""
    cases = tmp_path / "cases"
    cases.mkdir(exist_ok=True)
    (cases / "tiny.py").write_text("def ok(cell):\n    return None\n")
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path
