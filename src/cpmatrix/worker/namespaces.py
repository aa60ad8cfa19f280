"""Monkeypatches left behind: module namespaces, classes and ``sys.modules`` (in the ranks).

A case that replaces ``torch.testing.assert_close``, ``cpmatrix.parity.compare_tensors``,
a function of the user's own installed package or a method of ``DTensor`` and does not
put it back changes every later cell's verdict in that process. :class:`NamespaceWatch`
covers every module loaded when the world starts (torch's, numpy's, cpmatrix's, the
standard library's, the user's installed packages), every Python class defined in them,
and ``sys.modules`` itself:

- a function, class, method or descriptor replaced, deleted (or, in cpmatrix's own
  modules, any value at all changed) is **detected**: the value is put back, the cell
  fails with check ``process_state`` and its ranks run no more cells (whatever captured
  the patched object meanwhile cannot be found). torch's own wrappers (``__wrapped__``
  leading back, defined in a ``torch`` module, e.g. dynamo's around ``torch.manual_seed``)
  are not patches; neither is a submodule import setting its parent's attribute;
- ``sys.modules`` entries the cell replaced or removed are **restored**; modules it
  imported from the project (the matrix's ``pythonpath`` folders, and the bundled
  ``cpmatrix.suite``/``cpmatrix.recipes``) are dropped so the next cell imports them
  afresh; other modules it imported (an installed package used for the first time) stay
  and are watched from then on, and a function of the project found in one is a patch.

Cheap by construction: a dict's version tag (PEP 509, CPython's ``ma_version_tag``,
read with ctypes after a self-test) changes on every write, so only the namespaces a cell
wrote to are compared value by value (about 1 ms per cell for ~8,000 namespaces). Where
the tag cannot be read (another interpreter, a layout the self-test rejects), every
namespace is compared (slower, same result).

Imports only the standard library at import time.

Example::

    >>> import json
    >>> w = NamespaceWatch(project_roots=())
    >>> saved = json.dumps; json.dumps = lambda *a, **k: "{}"
    >>> w.after_cell()[0][:45], json.dumps is saved
    ('the case replaced or deleted json.dumps (a mo', True)
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys
import types
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cpmatrix.module_names import BUNDLED_CASES

__all__ = ["BUNDLED_CASES", "INTERPRETER_RECORDS", "SELF_PATCHING", "NamespaceWatch",
           "version_tags_work"]

#: cpmatrix's own modules: every value is compared, data too (a tolerance table).
_OWN = "cpmatrix"
_MISSING: Any = object()
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE
#: Names the interpreter itself writes into any module (a warning's once-registry).
_BOOKKEEPING = frozenset({"__warningregistry__"})
#: Names the interpreter itself writes, put back after every cell without blame:
#: ``sys.last_*`` record the last uncaught exception (set by the traceback machinery,
#: pytest's runner for post-mortem debugging, ``code.interact``); a cell's record of its
#: own failure is not a patch, and the next cell must not see it.
INTERPRETER_RECORDS: dict[str, frozenset[str]] = {
    "sys": frozenset({"last_type", "last_value", "last_traceback", "last_exc"}),
}
#: Namespaces their own library rewrites as it runs, with values of any origin: not
#: compared (docs/running.md lists them under "Not covered").
SELF_PATCHING = {
    "triton.language": "Triton's interpreter (TRITON_INTERPRET=1) rewrites triton.language "
                       "on every kernel launch (static_print = print, ...) and leaves the "
                       "patches of device-function calls in place",
}


# ---------------------------------------------------------------------- version tags

def _tag_offset() -> int | None:
    """The offset of ``ma_version_tag`` in a dict object, or None when it cannot be
    trusted here (checked on live dicts, never assumed)."""
    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        offset = 3 * ctypes.sizeof(ctypes.c_void_p)  # refcount, type, ma_used
        probes: list[dict[Any, Any]] = [{}, {"a": 1}, dict.fromkeys(range(40)), vars(types)]
        if any(ctypes.c_ssize_t.from_address(id(d) + 16).value != len(d) for d in probes):
            return None
        d: dict[str, Any] = {"x": 1}
        read = ctypes.c_uint64.from_address
        seen = [read(id(d) + offset).value]
        for key, value in (("x", 2), ("y", 3), ("x", None), ("z", 4)):
            if value is None:
                del d[key]
            else:
                d[key] = value
            seen.append(read(id(d) + offset).value)
        return offset if len(set(seen)) == len(seen) else None
    except (ValueError, OSError):
        return None


_OFFSET = _tag_offset()


def version_tags_work() -> bool:
    """Whether dict version tags can be read here (else every namespace is compared)."""
    return _OFFSET is not None


def _tag(d: dict[str, Any]) -> int:
    if _OFFSET is None:
        return -1
    return int(ctypes.c_uint64.from_address(id(d) + _OFFSET).value)


def _tag_view(d: dict[str, Any]) -> memoryview:
    """The 8 bytes of ``d``'s version tag, in place: ``b"".join`` of many such views
    reads every tag in one C loop (0.5 ms for 7,500 namespaces, against 8 ms one by one)."""
    assert _OFFSET is not None
    return memoryview((ctypes.c_char * 8).from_address(id(d) + _OFFSET))


#: Tags compared per block before looking at single ones.
_BLOCK = 64


# -------------------------------------------------------------------------- the watch

def _watchable(value: Any) -> bool:
    """Functions, builtins, classes and descriptors: what a monkeypatch replaces."""
    with warnings.catch_warnings():  # deprecated aliases warn when merely inspected
        warnings.simplefilter("ignore")
        try:
            return callable(value) or isinstance(value, classmethod | staticmethod | property)
        except Exception:  # an object whose class lookup itself fails
            return False


def _origin(value: Any) -> tuple[str, str]:
    """(module, file) where ``value`` was defined, read without running any of its code
    (a lazy-import proxy's ``__getattr__`` would import). ``("", "")`` when unknown: a
    ``functools.partial``, a builtin of no module.

    An instance (a ``MagicMock``, a torch op namespace) is defined where its class is.
    """
    for _ in range(4):
        if isinstance(value, types.MethodType | classmethod | staticmethod):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        elif isinstance(value, functools.partial | functools.partialmethod):
            value = value.func  # torch sets partials of its own on its C++ classes
        else:
            break
    if isinstance(value, types.FunctionType):
        return str(value.__module__ or ""), value.__code__.co_filename
    if isinstance(value, type):
        return str(vars(value).get("__module__", "") or ""), ""
    if isinstance(value, types.BuiltinFunctionType):
        return str(value.__module__ or ""), ""
    return str(vars(type(value)).get("__module__", "") or ""), ""


@functools.lru_cache(maxsize=4096)
def _real(path: str) -> str:
    """``os.path.realpath``, once per path (a stat per component: milliseconds)."""
    return os.path.realpath(path)


def _shadows(owner: type, key: str, value: Any) -> bool:
    """``value``, set on the class ``owner``, hides another value of a base class (the
    very same object again, as a restore with ``setattr`` leaves it, changes nothing)."""
    for base in owner.__mro__[1:]:
        inherited = vars(base).get(key, _MISSING)
        if inherited is not _MISSING:
            return inherited is not value
    return False


def _wraps(new: Any, old: Any) -> bool:
    """``new`` is ``functools.partial(old, ...)``: the original with other arguments
    (``partial(assert_close, rtol=1.0)``), a patch wherever ``partial`` was written."""
    return isinstance(new, functools.partial) and new.func is old


def _top(module: str) -> str:
    return module.partition(".")[0]


@dataclass(slots=True)
class _Space:
    """One watched namespace: a module's ``__dict__`` or a class's."""

    name: str
    namespace: dict[str, Any]
    #: The class, for a class's namespace (written through ``setattr``).
    owner: Any
    strict: bool
    #: The module the namespace belongs to (a class's: where it is defined).
    package: str
    copy: dict[str, Any] = field(default_factory=dict)

    def remember(self) -> None:
        self.copy = dict(self.namespace)

    def changes(self, is_submodule: Any, from_project: Any) -> list[str]:
        """Names the cell replaced, deleted or (in a way that patches) added.

        A function, class or descriptor replaced by one defined outside this namespace's
        own package, or deleted, is a patch: a library updating itself (torch's dynamo
        wrapping ``torch.manual_seed``, registering a property on one of its classes) is
        not. A value that was data becoming a function is a library's lazy set-up
        (``_cls = None`` filled on first use), unless it is the project's own code. A new
        name is a patch in cpmatrix's own modules, when it is the project's code, and on a
        class when it shadows an inherited attribute (``torch.Tensor.add = ...``).
        In cpmatrix's own modules, any change at all is a patch.
        """
        now = self.namespace
        home = _top(self.package)
        changed = []
        for key, old in self.copy.items():
            new = now.get(key, _MISSING)
            if new is old or key in _BOOKKEEPING or is_submodule(self.name, key, new):
                continue
            foreign = new is _MISSING or _top(_origin(new)[0]) != home or _wraps(new, old)
            if self.strict or from_project(new) or (_watchable(old) and foreign):
                changed.append(key)
        for key in now.keys() - self.copy.keys():
            value = now[key]
            if key in _BOOKKEEPING or is_submodule(self.name, key, value):
                continue
            if self.strict or from_project(value) or (
                    self.owner is not None and _watchable(value)
                    and _top(_origin(value)[0]) != home
                    and _shadows(self.owner, key, value)):
                changed.append(key)
        return changed

    def put_back(self, keys: Sequence[str]) -> None:
        for key in keys:
            old = self.copy.get(key, _MISSING)
            try:
                if self.owner is None:
                    if old is _MISSING:
                        self.namespace.pop(key, None)
                    else:
                        self.namespace[key] = old
                elif old is _MISSING:
                    delattr(self.owner, key)
                else:
                    setattr(self.owner, key, old)
            except (AttributeError, TypeError):
                pass


class NamespaceWatch:
    """Snapshot at world start; :meth:`after_cell` restores ``sys.modules`` and reports
    patched namespaces."""

    def __init__(self, project_roots: Sequence[str]) -> None:
        self.roots = tuple(os.path.realpath(p) + os.sep for p in project_roots if p)
        self.spaces: list[_Space] = []
        #: Per space, its version tag in place, and all of them as last seen clean.
        self._views: list[memoryview] = []
        self._tags = bytearray()
        self._classes: set[int] = set()
        self.modules = dict(sys.modules)
        self._names, self._values = list(self.modules), list(self.modules.values())
        self.modules_tag = _tag(sys.modules)
        #: Packages loaded before any cell (torch, numpy, cpmatrix): never dropped, even
        #: when a pythonpath folder holds them; half-reloading torch would break it.
        self.preloaded = {name.partition(".")[0] for name in sys.modules}
        self._before: set[str] = set()
        for name, module in list(sys.modules.items()):
            self._watch_module(name, module)

    # --------------------------------------------------------------- what is watched
    def _watch_module(self, name: str, module: Any) -> None:
        if not isinstance(module, types.ModuleType) or name in ("__main__", "__mp_main__"):
            return
        if name.startswith(tuple(SELF_PATCHING)):
            return
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or self._is_project(name, module):
            return
        strict = name == _OWN or name.startswith(_OWN + ".")
        self._add(_Space(name=name, namespace=namespace, owner=None, strict=strict,
                         package=name))
        with warnings.catch_warnings():  # a deprecated alias may warn when touched
            warnings.simplefilter("ignore")
            for value in list(namespace.values()):
                if isinstance(value, type) and id(value) not in self._classes:
                    self._watch_class(value, strict)

    def _watch_class(self, cls: type, strict: bool) -> None:
        self._classes.add(id(cls))
        if cls.__flags__ & _IMMUTABLE_TYPE:  # a builtin or static type: cannot be patched
            return
        module = str(vars(cls).get("__module__", "") or "")
        if module.startswith(tuple(SELF_PATCHING)):
            return
        inner = [d for d in gc.get_referents(cls.__dict__) if isinstance(d, dict)]
        if len(inner) != 1:
            return
        self._add(_Space(name=f"{module}.{cls.__qualname__}", namespace=inner[0],
                         owner=cls, strict=False, package=module))

    def _add(self, space: _Space) -> None:
        space.remember()
        self.spaces.append(space)
        if _OFFSET is not None:
            view = _tag_view(space.namespace)
            self._views.append(view)
            self._tags += view.tobytes()

    def _written(self) -> list[int]:
        """The spaces written to since they were last seen clean (all, without tags)."""
        if _OFFSET is None:
            return list(range(len(self.spaces)))
        now = b"".join(self._views)
        if now == self._tags:
            return []
        step = 8 * _BLOCK
        written = []
        for start in range(0, len(now), step):
            if now[start:start + step] != self._tags[start:start + step]:
                written += [start // 8 + i for i in range(_BLOCK)
                            if now[start + 8 * i:start + 8 * i + 8]
                            != self._tags[start + 8 * i:start + 8 * i + 8]]
        return written

    def _is_project(self, name: str, module: Any) -> bool:
        if name in BUNDLED_CASES or name.startswith(tuple(f"{b}." for b in BUNDLED_CASES)):
            return True
        if name.partition(".")[0] in self.preloaded:
            return False
        file = getattr(module, "__file__", None)
        return isinstance(file, str) and _real(file).startswith(self.roots)

    # --------------------------------------------------------------------- per cell
    def before_cell(self) -> None:
        self._before = set(sys.modules)

    def after_cell(self) -> list[str]:
        """Restore ``sys.modules``; put back and describe every patched namespace."""
        problems = self._modules()
        patched: list[str] = []
        for i in self._written():
            space = self.spaces[i]
            keys = space.changes(self._submodule, self._from_project)
            quiet = INTERPRETER_RECORDS.get(space.name)
            if quiet:
                space.put_back([k for k in quiet if space.namespace.get(k, _MISSING)
                                is not space.copy.get(k, _MISSING)])
                keys = [k for k in keys if k not in quiet]
            if keys:
                space.put_back(keys)
                patched += [f"{space.name}.{k}" for k in keys]
            space.remember()  # after putting back: its values now are its baseline's
            if _OFFSET is not None:
                self._tags[8 * i:8 * i + 8] = self._views[i].tobytes()
        if patched:
            shown = ", ".join(patched[:5])
            more = f" and {len(patched) - 5} more" if len(patched) > 5 else ""
            problems.insert(0, f"the case replaced or deleted {shown}{more} (a monkeypatch "
                               "left in place would change every later cell's verdict)")
        return problems

    def _submodule(self, parent: str, key: str, value: Any) -> bool:
        """An import setting its parent's attribute (``import a.b`` sets ``a.b``)."""
        return isinstance(value, types.ModuleType) and \
            sys.modules.get(f"{parent}.{key}") is value

    def _modules(self) -> list[str]:
        """Put back the world's ``sys.modules`` entries; drop the project's new ones;
        watch other new modules from now on."""
        problems: list[str] = []
        modules: dict[str, Any] = sys.modules
        if self.modules_tag != -1 and _tag(modules) == self.modules_tag:
            return problems
        if list(map(modules.get, self._names)) != self._values:  # one C loop, by identity
            for name, module in self.modules.items():
                if modules.get(name, _MISSING) is not module:
                    modules[name] = module  # a case's stand-in (or a deletion) is undone
        added = modules.keys() - self.modules.keys()
        for name in added:
            module = modules[name]
            if self._is_project(name, module):
                del modules[name]  # imported afresh by the next cell
                parent, _, child = name.rpartition(".")
                owner = getattr(modules.get(parent), "__dict__", {}) if parent else {}
                if owner.get(child) is module:
                    del owner[child]  # the import set it; the next import sets it again
                continue
            self.modules[name] = module
            before = len(self.spaces)
            self._watch_module(name, module)
            problems += self._injected(self.spaces[before:])
        if added:
            self._names, self._values = list(self.modules), list(self.modules.values())
        self.modules_tag = _tag(modules)
        return problems

    def _from_project(self, value: Any) -> bool:
        """``value`` is a function, class or object of the project's own code."""
        if value is _MISSING:
            return False
        module, file = _origin(value)
        # Only a real file: exec'd code ("<string>": a dataclass's __init__) has none.
        if os.path.isabs(file) and _real(file).startswith(self.roots):
            return True
        home = sys.modules.get(module)
        return home is not None and self._is_project(module, home)

    def _injected(self, spaces: Sequence[_Space]) -> list[str]:
        """A module first imported by this cell holding a function of the project: the
        cell patched it right after importing it (its first sight is not its baseline)."""
        found = [f"{space.name}.{key}" for space in spaces
                 for key, value in space.copy.items() if self._from_project(value)]
        if not found:
            return []
        return [f"the case replaced {', '.join(found[:5])} with its own code (a monkeypatch "
                "left in place would change every later cell's verdict)"]
