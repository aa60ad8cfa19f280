"""The paths of a target's ``pytest:`` value: the files, folders or node ids whose tests
it runs, read and checked by the loader like any other value of the matrix.

A path is relative to the matrix file's folder (as ``pythonpath`` is); a node id is a
path followed by ``::`` and the test's name. Each must name a file or folder that exists.
What tests they hold is not the spec's to know: the pytest kind collects them, handed to
:func:`cpmatrix.matrix.expand.expand` as its ``collect``.

Example::

    >>> from cpmatrix.matrix.yamlreader import compose
    >>> reader, node = compose("[tests/a.py, 'tests/b.py::TestB::test_x']", "m.yaml")
    >>> pytest_paths(reader, node, "targets[0].pytest", "/repo", exists=lambda p: True)
    ('/repo/tests/a.py', '/repo/tests/b.py::TestB::test_x')
"""

from __future__ import annotations

import os
from collections.abc import Callable

import yaml

from cpmatrix.matrix.yamlreader import SpecReader

__all__ = ["pytest_paths"]

_ALLOWED = "a file, a folder or a node id (tests/dist/test_ops.py::TestOps::test_add), or a " \
    "list of them, relative to the matrix file"


def pytest_paths(ctx: SpecReader, node: yaml.Node, path: str, base_dir: str, *,
                 exists: Callable[[str], bool] = os.path.exists) -> tuple[str, ...]:
    """The absolute paths and node ids of a ``pytest:`` value (one string or a list)."""
    items: list[tuple[object, yaml.Node, str]]
    if isinstance(node, yaml.SequenceNode):
        items = list(ctx.scalar_list(node, path))
        if not items:
            raise ctx.error(node, path, "an empty list of tests", _ALLOWED)
    else:
        items = [(ctx.scalar(node, path), node, path)]
    out: list[str] = []
    for value, item, ipath in items:
        if not isinstance(value, str) or not value.strip():
            raise ctx.error(item, ipath, f"expected a path or node id, got {value!r}",
                            _ALLOWED)
        file, sep, rest = value.partition("::")
        full = os.path.abspath(os.path.join(base_dir, file))
        if not exists(full):
            raise ctx.error(item, ipath, f"no such file or folder {full!r}", _ALLOWED)
        if sep and not rest:
            raise ctx.error(item, ipath, f"{value!r}: nothing after '::'", _ALLOWED)
        entry = f"{full}{sep}{rest}"
        if entry in out:
            raise ctx.error(item, ipath, f"duplicate {value!r}")
        out.append(entry)
    return tuple(out)
