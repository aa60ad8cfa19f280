"""Which collected tests need several ranks, and how many: the dialects (no test changed).

Runs where pytest collected the tests (the user's pytest with ``--cpmatrix``, or the
collector of a ``pytest:`` matrix target). :func:`placement` answers for one item:

1. ``marker``: ``@pytest.mark.world(4)`` or ``@pytest.mark.world("2x2")`` (a mesh; ``dims=``
   names its dimensions) on the test, its class or its module;
2. ``torch``: a unittest test whose class derives from torch's ``MultiProcessTestCase``
   (``DTensorTestBase``, ``DistributedTestBase``, ...): its ``world_size``, read from an
   instance as the harness reads it;
3. ``torch_continuous``: from ``MultiProcContinuousTest`` (``DTensorContinuousTestBase``):
   the class's ``world_size`` (a property or a class attribute; unset: the device count);
4. ``deepspeed``: a plain pytest class with a ``world_size`` class attribute, an int or a
   list of ints (DeepSpeed's ``DistributedTest``): one world per size.

Any other test returns None and runs as usual; a torch-harness test cpmatrix cannot run
faithfully (its world size unreadable or out of range, its backend missing) is placed
``native`` with a one-line note: it runs as usual too, and torch's harness decides.

The timeout is the test's ``timeout`` marker (pytest-timeout's), else torch's own
per-test table for the torch dialects, else DeepSpeed's ``exec_timeout``, else the
caller's default. Bad values raise :class:`DialectError` naming the test, the value and
what is allowed.

Example (a bare item-like object)::

    >>> class Mark:
    ...     def __init__(self, *args, **kwargs): self.args, self.kwargs = args, kwargs
    >>> class Item:
    ...     nodeid, cls = "t.py::test_a", None
    ...     def __init__(self, marks): self.marks = marks
    ...     def get_closest_marker(self, name): return self.marks.get(name)
    >>> placement(Item({"world": Mark("2x2")}))
    Placement(dialect='marker', meshes=('2x2',), timeout_s=None, isolated=False, \
dims=('cp0', 'cp1'))
    >>> placement(Item({"world": Mark(4), "timeout": Mark(30)})).timeout_s
    30
    >>> placement(Item({}))
"""

from __future__ import annotations

import inspect
import math
import sys
import unittest
from dataclasses import dataclass
from typing import Any, Final

from cpmatrix.cell import MESH_DIMS
from cpmatrix.matrix.schema import MAX_RANKS, MAX_TIMEOUT_S, Mesh

__all__ = ["DialectError", "Placement", "placement", "timeout_of"]

_COMMON_DISTRIBUTED: Final = "torch.testing._internal.common_distributed"
#: What torch's harness calls to start a test's rank processes.
_SPAWN_METHODS: Final = ("_spawn_processes", "_fork_processes", "_start_processes")


class DialectError(Exception):
    """A test asks for ranks in a way the front cannot read (names the test and the fix)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """How a test runs in worlds."""

    dialect: str
    #: One world per entry, as ``RxC``.
    meshes: tuple[str, ...]
    timeout_s: int | None = None
    isolated: bool = False
    #: The marker dialect's mesh dimension names.
    dims: tuple[str, ...] = ()
    #: ``native``: why the test runs as it would without cpmatrix (a shape of torch's
    #: harness cpmatrix cannot run faithfully), one line.
    note: str = ""


def _size_mesh(nodeid: str, value: Any, what: str) -> str:
    """A world size or mesh (``4``, ``"2x2"``) as ``RxC``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise DialectError(f"{nodeid}: {what} {value!r}: expected a number of ranks (4) "
                           "or a mesh ('2x2')")
    if isinstance(value, int):
        if not 1 <= value <= MAX_RANKS:
            raise DialectError(f"{nodeid}: {what} {value}: a world has 1 to {MAX_RANKS} "
                               "ranks")
        return f"1x{value}"
    try:
        mesh = Mesh.parse(value)
    except ValueError:
        raise DialectError(f"{nodeid}: {what} {value!r}: expected a number of ranks (4) or "
                           "a mesh 'RxC' ('2x2')") from None
    if mesh.world_size > MAX_RANKS:
        raise DialectError(f"{nodeid}: {what} {value!r}: {mesh.world_size} ranks, more than "
                           f"{MAX_RANKS}")
    return str(mesh)


def timeout_of(item: Any) -> int | None:
    """The `timeout` marker's seconds (pytest-timeout's), if any."""
    mark = item.get_closest_marker("timeout")
    if mark is None:
        return None
    value = mark.kwargs.get("timeout", mark.args[0] if mark.args else None)
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise DialectError(f"{item.nodeid}: timeout marker {value!r}: expected seconds") \
            from None
    if not (0 < seconds <= MAX_TIMEOUT_S):
        # pytest-timeout reads 0 as "no timeout": cpmatrix always has one; the longest.
        return MAX_TIMEOUT_S if seconds == 0 else None
    return max(1, math.ceil(seconds))


def _marker(item: Any, mark: Any) -> Placement:
    if len(mark.args) != 1 or set(mark.kwargs) - {"dims"}:
        raise DialectError(f"{item.nodeid}: @pytest.mark.world takes one size or mesh and "
                           "an optional dims=(...): world(4), world('2x2', dims=('dp', 'tp'))")
    mesh = _size_mesh(item.nodeid, mark.args[0], "@pytest.mark.world")
    ndim = 1 if isinstance(mark.args[0], int) else 2
    dims = mark.kwargs.get("dims", MESH_DIMS[:ndim])
    if isinstance(dims, str):
        dims = (dims,)
    if not isinstance(dims, tuple | list) or len(dims) != ndim or not all(
            isinstance(d, str) and d for d in dims) or len(set(dims)) != ndim:
        raise DialectError(f"{item.nodeid}: @pytest.mark.world dims={dims!r}: {ndim} distinct "
                           f"names, one per mesh dimension")
    return Placement("marker", (mesh,), dims=tuple(dims))


def _own(cls: type, name: str) -> Any:
    """The function ``name`` of ``cls`` itself (a classmethod's function), or None."""
    found = cls.__dict__.get(name)
    if isinstance(found, classmethod | staticmethod):
        found = found.__func__
    return found if inspect.isfunction(found) else None


def _names(fn: Any) -> set[str]:
    """Every name a function's code (and the code nested in it) refers to."""
    out: set[str] = set()
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        out.update(code.co_names)
        stack.extend(c for c in code.co_consts if inspect.iscode(c))
    return out


def _spawners() -> dict[Any, str]:
    """torch's own functions that start a test's rank processes -> the dialect."""
    module = sys.modules.get(_COMMON_DISTRIBUTED)
    out: dict[Any, str] = {}
    for base, names, dialect in (("MultiProcessTestCase", _SPAWN_METHODS, "torch"),
                                 ("MultiProcContinuousTest", ("_spawn_processes",),
                                  "torch_continuous")):
        cls = getattr(module, base, None)
        if isinstance(cls, type):
            for name in names:
                fn = _own(cls, name)
                if fn is not None:
                    out[fn] = dialect
    return out


def _torch_base(cls: type) -> str | None:
    """``torch`` or ``torch_continuous`` when running ``cls``'s test would start rank
    processes through torch's harness: its ``setUp``/``setUpClass`` reach (through the
    methods they call on the class, ``super()`` included) torch's own
    ``_spawn_processes``/``_fork_processes`` or the continuous worker pool's spawn.
    Decided by what the class does, not its bases' names: LocalTensor classes (whose
    ``_spawn_processes`` does nothing), ``MultiThreadedTestCase`` (threads), a fake
    group made in one process, or a spawn of the class's own are not (they run here)."""
    spawners = _spawners()
    if not spawners:
        return None
    mro = inspect.getmro(cls)
    seen: set[tuple[type, str]] = set()
    todo = [(cls, "setUp"), (cls, "setUpClass")]
    while todo:
        start, name = todo.pop()
        # The implementation ``start``'s lookup of ``name`` finds (``start`` is a class
        # of the MRO: a ``super()`` call continues after the class that made it).
        for at in range(mro.index(start), len(mro)):
            fn = _own(mro[at], name)
            if fn is not None:
                break
        else:
            continue
        if (mro[at], name) in seen:
            continue
        seen.add((mro[at], name))
        if fn in spawners:
            return spawners[fn]
        names = _names(fn)
        if "super" in names and at + 1 < len(mro):
            todo.append((mro[at + 1], name))
        for n in names - {name}:
            attr = inspect.getattr_static(cls, n, None)
            if inspect.isfunction(attr) or isinstance(attr, classmethod | staticmethod):
                todo.append((cls, n))
    return None


def _torch_timeout(item: Any, test_id: str) -> int | None:
    module = sys.modules.get(_COMMON_DISTRIBUTED)
    get: Any = getattr(module, "get_timeout", None)
    if not callable(get):
        return None
    try:
        return int(get(test_id))
    except Exception:
        return None


def _continuous_size(cls: type) -> Any:
    """``MultiProcContinuousTest._get_world_size`` without spawning anything."""
    attr = inspect.getattr_static(cls, "world_size", None)
    size: Any = attr
    if isinstance(attr, property) and attr.fget is not None:
        size = attr.fget(object.__new__(cls))  # as torch's own harness reads it
    if size == -2:  # unset: one rank per device of the class's device type
        import torch

        device = cls.__dict__.get("device_type", getattr(cls, "device_type", "cpu"))
        if isinstance(device, classmethod):
            device = device.__func__(cls)
        elif isinstance(device, property):
            device = device.fget(cls) if device.fget else "cpu"  # as torch's harness does
        elif callable(device):
            device = device()
        size = torch.get_device_module(str(device)).device_count()
    return size


#: The backends a continuous class may pin, and how torch's harness checks each.
_BACKEND_CHECKS: Final = {"nccl": "is_nccl_available", "gloo": "is_gloo_available",
                          "mpi": "is_mpi_available", "xccl": "is_xccl_available"}


def _missing_backend(cls: type) -> str | None:
    """The backend a continuous class pins (``backend_str``) that this host lacks."""
    import torch.distributed as dist

    get = getattr(cls, "backend_str", None)
    backend = get() if callable(get) else get
    check = getattr(dist, _BACKEND_CHECKS.get(str(backend), ""), None)
    return str(backend) if callable(check) and not check() else None


def _native(item: Any, why: str) -> Placement:
    return Placement("native", (), note=f"{item.nodeid}: runs as without cpmatrix: {why}")


def _torch(item: Any, dialect: str) -> Placement:
    """A torch-harness test's world; a shape cpmatrix cannot run faithfully (a world
    size it cannot read or hold, a backend the host lacks) runs natively: torch's
    harness then skips or fails it as it always would."""
    cls = item.cls
    try:
        if dialect == "torch":
            inst = item.instance
            size = inst.world_size
            test_id = inst.id()
        else:
            size = _continuous_size(cls)
            test_id = f"{cls.__module__}.{cls.__qualname__}.{item.name}"
            backend = _missing_backend(cls)
            if backend is not None:
                return _native(item, f"its class pins backend {backend!r}, not available "
                               "here")
    except Exception as exc:
        return _native(item, f"cannot read its world_size ({type(exc).__name__}: {exc})")
    try:
        mesh = _size_mesh(item.nodeid, size, "world_size")
    except DialectError as exc:
        return _native(item, str(exc).removeprefix(f"{item.nodeid}: "))
    return Placement(dialect, (mesh,), timeout_s=_torch_timeout(item, test_id))


def _deepspeed(item: Any, sizes: Any) -> Placement:
    if inspect.getattr_static(item.cls, "init_distributed", True) is False:
        # Its processes start without a process group; a cell's ranks have one.
        return _native(item, "its class sets init_distributed = False (its launched "
                       "processes have no process group; a world's ranks do)")
    values = list(sizes) if isinstance(sizes, list | tuple) else [sizes]
    if not values:
        raise DialectError(f"{item.nodeid}: world_size = []: at least one world size")
    meshes = tuple(dict.fromkeys(_size_mesh(item.nodeid, v, "world_size") for v in values))
    timeout = getattr(item.cls, "exec_timeout", None)
    seconds: int | None = None
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        seconds = min(MAX_TIMEOUT_S, math.ceil(timeout))
    return Placement("deepspeed", meshes, timeout_s=seconds)


def placement(item: Any) -> Placement | None:
    """How ``item`` runs in worlds; None: it is not a multi-rank test (runs as usual)."""
    found: Placement | None = None
    mark = item.get_closest_marker("world")
    cls = getattr(item, "cls", None)
    if mark is not None:
        found = _marker(item, mark)
    elif cls is not None and issubclass(cls, unittest.TestCase):
        dialect = _torch_base(cls)
        if dialect is not None:
            found = _torch(item, dialect)
    elif cls is not None:
        sizes = inspect.getattr_static(cls, "world_size", None)
        if isinstance(sizes, int | list | tuple) and not isinstance(sizes, bool):
            # DistributedTest._get_world_size: a method's @pytest.mark.world_size(N)
            # wins over the class's world_size.
            override = item.get_closest_marker("world_size")
            found = _deepspeed(item, override.args[0] if override is not None
                               and override.args else sizes)
    if found is None or found.dialect == "native":
        return found
    timeout = timeout_of(item)
    return Placement(found.dialect, found.meshes,
                     timeout_s=timeout if timeout is not None else found.timeout_s,
                     isolated=item.get_closest_marker("isolated_world") is not None,
                     dims=found.dims)
