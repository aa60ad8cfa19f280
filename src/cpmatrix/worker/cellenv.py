"""Each cell starts in the environment of a world of its own size (runs inside the ranks).

A rank of a world runs many cells, of several sizes and on several rank subsets. At the
*start* of every cell (never "restored after the previous one"), :class:`CellEnvironment`
gives the process exactly what ``torchrun`` would have given a rank of a world holding
that cell alone:

- the environment: the world's own (as the launcher set it) with the rank variables of
  the cell: ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_NAME``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE``, ``ROLE_WORLD_SIZE``,
  ``MASTER_ADDR``/``MASTER_PORT`` (the world's rendezvous store, as torchrun's agent
  store); on cuda ``LOCAL_RANK`` stays the rank's device index (a case may pick its
  device by it). Whatever a previous cell set or deleted, through ``os.environ`` or
  ``os.putenv``, is gone;
- a fresh working folder, ``HOME`` and ``TMPDIR`` (``tempfile.gettempdir()`` too) of its
  own, shared by the cell's ranks as torchrun's ranks share a working directory:
  ``<out>/<cell folder>/work/<world>/{cwd,home,tmp}``
  (:func:`cpmatrix.layout.work_folder`). The supervisor removes it when the cell
  passed, and keeps it for the report when it did not.

Standard library only.

Example::

    >>> env = cell_env({"PATH": "/bin", "RANK": "3", "MASTER_PORT": "29500"}, local=1,
    ...                size=2, device_index=None, home="/w/home", tmp="/w/tmp", cwd="/w/cwd")
    >>> env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["HOME"], env["PATH"]
    ('1', '1', '2', '/w/home', '/bin')
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpmatrix.layout import work_folder

__all__ = ["RANK_VARIABLES", "CellEnvironment", "c_environ", "cell_env"]

#: What torchrun sets per rank (its local elastic agent), set here per cell.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
                  "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")


def cell_env(base: Mapping[str, str], *, local: int, size: int, device_index: int | None,
             home: str, tmp: str, cwd: str) -> dict[str, str]:
    """The environment of rank ``local`` of a cell of ``size`` ranks on one node.

    ``device_index``: the rank's cuda device (``LOCAL_RANK`` on cuda), None on cpu.
    ``MASTER_ADDR``/``MASTER_PORT`` and everything else come from ``base`` (the world's).
    """
    env = dict(base)
    env.update({
        "RANK": str(local), "LOCAL_RANK": str(local if device_index is None else device_index),
        "GROUP_RANK": "0", "ROLE_RANK": str(local), "ROLE_NAME": "default",
        "WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size), "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(size), "HOME": home, "TMPDIR": tmp,
    })
    for alias in ("TMP", "TEMP"):  # tempfile reads these after TMPDIR
        if alias in env:
            env[alias] = tmp
    if "PWD" in env:
        env["PWD"] = cwd
    return env


_ENVIRON: list[object] = []


def c_environ() -> dict[str, str] | None:
    """The C library's environment (what ``os.putenv`` changes and children inherit),
    or None where it cannot be read."""
    if not _ENVIRON:
        try:
            _ENVIRON.append(ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None),
                                                                  "environ"))
        except (OSError, ValueError, AttributeError):
            _ENVIRON.append(None)
    environ: Any = _ENVIRON[0]
    if environ is None:
        return None
    out: dict[str, str] = {}
    i = 0
    while environ[i] is not None:
        key, sep, value = os.fsdecode(environ[i]).partition("=")
        if sep:
            out[key] = value
        i += 1
    return out


def _set_environ(target: Mapping[str, str]) -> None:
    """Make ``os.environ`` *and* the C environment exactly ``target``."""
    for key in [k for k in os.environ if k not in target]:
        del os.environ[key]
    for key, value in target.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    native = c_environ()
    if native is None:
        return
    for key, value in native.items():  # set by os.putenv, behind os.environ's back
        if key not in target:
            os.unsetenv(key)
        elif value != target[key]:
            os.putenv(key, target[key])


class CellEnvironment:
    """Enters each cell's environment and folders; leaves the world's between cells."""

    def __init__(self, *, world_dir: str, out_root: str, world_name: str,
                 device_index: int | None) -> None:
        #: The world's environment, as the launcher set it (read once, at world start).
        self.base = dict(os.environ)
        self.world_dir = world_dir
        self.out_root = out_root
        self.world_name = world_name
        self.device_index = device_index
        self.world_tempdir = tempfile.tempdir

    def folder(self, out_dir: str) -> Path:
        """The cell's working folder (``cwd``, ``home``, ``tmp`` below it)."""
        return Path(self.out_root, work_folder(out_dir, self.world_name))

    def enter(self, out_dir: str, *, local: int, size: int) -> Path:
        """Give this process the cell's environment, working directory and temp folder."""
        root = self.folder(out_dir)
        cwd, home, tmp = root / "cwd", root / "home", root / "tmp"
        for path in (cwd, home, tmp):
            path.mkdir(parents=True, exist_ok=True)  # the cell's ranks race here: harmless
        _set_environ(cell_env(self.base, local=local, size=size,
                              device_index=self.device_index, home=str(home), tmp=str(tmp),
                              cwd=str(cwd)))
        os.chdir(cwd)
        tempfile.tempdir = str(tmp)  # gettempdir() caches its first answer: not the world's
        return root

    def leave(self) -> None:
        """Back to the world's environment and folder (the cell's may be removed now)."""
        os.chdir(self.world_dir)
        _set_environ(self.base)
        tempfile.tempdir = self.world_tempdir
