"""What a rank does around one test, per dialect (runs inside the ranks).

A cell's ranks already hold a default process group of exactly the cell's ranks
(:mod:`cpmatrix.worker.subworld`) when the test starts. Around every test
(:func:`in_test`):

- ``init_process_group`` joins that group instead of making one (a test's own init, a
  harness's ``init_pg``); asking for another size or rank is an error that says so;
- destroying the default group is a no-op (``with_comms``, ``destroy_pg`` and
  ``MultiProcessTestCase`` destroy it after each test; the cell's group belongs to the
  world). Both are put back when the test ends;
- the groups the test made (meshes, ``new_group``) are destroyed after it, with
  DTensor's caches that could still name them, and through DeepSpeed's comm where the
  test initialized it (DeepSpeed then forgets those it kept): natively each such test
  ends its process;
- what they wrote to the default group's store is in the test's own namespace (a
  ``PrefixStore`` per test): natively each test's processes have a fresh store;
- the working folder is the folder pytest was started in.

Per dialect, the test is run the way the harness's own worker would run it:

- ``torch`` (``MultiProcessTestCase``, ``DTensorTestBase``): ``setUp`` runs as usual, and
  where it would spawn the ranks (``_spawn_processes``/``_fork_processes``) the instance
  *becomes* this rank instead (``self.rank``, the RNG seeded as ``run_test`` does); a
  ``sys.exit`` with one of torch's skip codes (``skip_if_lt_x_gpu``) is a skip; the
  torchrun variables a cell has (``RANK``, ``WORLD_SIZE``, ...) are hidden, as a spawned
  worker has none;
- ``torch_continuous`` (``MultiProcContinuousTest``): as its worker loop does, the test
  method runs on an instance with ``rank`` and ``world_size`` set, without ``setUp`` and
  ``tearDown`` (they dispatch to the worker processes), ``pg`` the cell's group;
- ``deepspeed`` (a plain class with ``world_size``): the conftest's launching hook
  (``pytest_runtest_call``) steps aside for these tests, the rank being one of the
  processes it would launch (:func:`step_aside_launchers`); the method runs as any test;
- ``marker`` (``@pytest.mark.world``): nothing more; the fixtures do the rest.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import unittest
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cpmatrix.cell import CellContext
from cpmatrix.worker.meshes import clear_dtensor_caches

__all__ = ["Dialect", "dialect_of", "in_test", "step_aside_launchers"]

_COMMON_DISTRIBUTED = "torch.testing._internal.common_distributed"
_COMMON_UTILS = "torch.testing._internal.common_utils"
#: What MultiProcessTestCase calls to start its worker processes.
_SPAWNERS = ("_spawn_processes", "_fork_processes", "_start_processes")
#: What torchrun (and so a cell) sets that a MultiProcessTestCase worker never has.
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MISSING: Any = object()


@contextlib.contextmanager
def _worker_environment(**extra: str) -> Iterator[None]:
    """The environment of torch's own workers: no torchrun variables (a cell has them),
    plus ``extra``; the cell's put back afterwards."""
    hidden = {k: os.environ.pop(k) for k in list(os.environ)
              if k in _TORCHRUN_VARS or k.startswith("TORCHELASTIC_")}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k in extra:
            os.environ.pop(k, None)
        os.environ.update(hidden)


class Dialect:
    """The default: the test runs as pytest runs it (the ``marker`` dialect)."""

    name = "marker"

    @contextlib.contextmanager
    def around(self, item: Any, cell: CellContext) -> Iterator[None]:
        yield


def _skip_codes() -> dict[int, str]:
    module = sys.modules.get(_COMMON_DISTRIBUTED)
    table = getattr(module, "TEST_SKIPS", {}) if module is not None else {}
    return {skip.exit_code: skip.message for skip in table.values()}


def _seed() -> None:
    module = sys.modules.get(_COMMON_UTILS)
    if module is not None:
        module.set_rng_seed()


def _as_rank(fn: Callable[..., Any], ready: Callable[[], None]) -> Callable[..., Any]:
    """The test method, run as a torch worker runs it: ``ready()`` first (if the harness
    did not become the rank in ``setUp``), a skip code's ``sys.exit`` a skip, a
    ``pytest.exit()`` a failure of the test."""

    @functools.wraps(fn)  # keeps __unittest_expecting_failure__ and skip attributes
    def run(*args: Any, **kwargs: Any) -> Any:
        ready()
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            message = _skip_codes().get(exc.code) if isinstance(exc.code, int) else None
            if message is not None:
                raise unittest.SkipTest(message) from None
            raise
        except Exception as exc:
            import pytest

            if not isinstance(exc, pytest.exit.Exception):
                raise
            # torch's worker catches it as any exception and exits with its error code:
            # the test fails, the session goes on (pytest would end it here).
            raise RuntimeError(f"pytest.exit() in a spawned rank's test fails the test, "
                               f"as in torch's worker: {exc.msg}") from exc

    return run


def _share_file_name(inst: Any) -> None:
    """Natively ``setUp`` makes ``file_name`` once, in the parent, and every spawned rank
    gets it (``FileStore(self.file_name)`` rendezvous there): here each rank's ``setUp``
    made its own, so the cell's rank 0's is every rank's (the others' removed)."""
    import torch.distributed as dist

    mine = getattr(inst, "file_name", None)
    if not isinstance(mine, str):
        return
    names: list[Any] = [mine]
    dist.broadcast_object_list(names, src=0)
    if names[0] != mine:
        with contextlib.suppress(OSError):
            os.remove(mine)
        inst.file_name = names[0]


class _Torch(Dialect):
    name = "torch"

    @contextlib.contextmanager
    def around(self, item: Any, cell: CellContext) -> Iterator[None]:
        import torch.distributed as dist

        inst = item.instance
        rank, size = dist.get_rank(), dist.get_world_size()
        main = getattr(type(inst), "MAIN_PROCESS_RANK", -1)
        became: list[bool] = []

        def become_rank(*_args: Any, **_kwargs: Any) -> None:
            if int(inst.world_size) != size:
                raise RuntimeError(f"cpmatrix: the test's world_size is {inst.world_size} "
                                   f"but its cell has {size} ranks")
            inst.rank = rank
            _share_file_name(inst)
            os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
            _seed()  # as MultiProcessTestCase.run_test does in each worker
            became.append(True)

        def ready() -> None:
            # A setUp that never spawned would leave the main-process role: the wrapper
            # would join no workers and pass without running the test. Run it instead.
            if not became or getattr(inst, "rank", main) == main:
                become_rank()

        for name in _SPAWNERS:
            setattr(inst, name, become_rank)
        item.obj = _as_rank(item.obj, ready)
        with _worker_environment():
            yield


class _TorchContinuous(Dialect):
    name = "torch_continuous"

    @contextlib.contextmanager
    def around(self, item: Any, cell: CellContext) -> Iterator[None]:
        import torch.distributed as dist

        inst = item.instance
        cls = type(inst)
        rank, size = dist.get_rank(), dist.get_world_size()
        values = {"rank": rank, "world_size": size,
                  "pg": dist.distributed_c10d._get_default_group()}
        saved = {k: cls.__dict__.get(k, _MISSING) for k in values}
        # The class first, as its worker loop sets them: a read-only property there
        # (``world_size``) is replaced, so the instance's own attributes can be set.
        for k, v in values.items():
            setattr(cls, k, v)
        inst.rank, inst.world_size = rank, size
        # Its setUp/tearDown dispatch the test to worker processes: its workers run
        # neither, only the method (MultiProcContinuousTest._run_test_given_id).
        inst.setUp = lambda: None
        inst.tearDown = lambda: None
        item.obj = _as_rank(item.obj, _seed)
        try:
            # Its worker sets LOCAL_RANK to its rank when it makes its group.
            with _worker_environment(LOCAL_RANK=str(rank)):
                yield
        finally:
            for k, v in saved.items():
                if v is _MISSING:
                    with contextlib.suppress(AttributeError):
                        delattr(cls, k)
                else:
                    setattr(cls, k, v)


def _deepspeed_module() -> Any:
    """DeepSpeed's package where it is installed, else None (a folder named
    ``deepspeed`` on ``sys.path``, such as a suite's own tests, is a namespace package,
    not DeepSpeed: never imported here)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    module = importlib.import_module("deepspeed")
    return module if callable(getattr(module, "init_distributed", None)) else None


def _accelerator_count(deepspeed: Any) -> int:
    """Devices of the host's accelerator as DeepSpeed counts them (its ``get_accelerator``
    where DeepSpeed is installed, else torch's); 0 without one."""
    if deepspeed is not None:
        from deepspeed.accelerator import get_accelerator  # type: ignore[import-not-found]

        acc = get_accelerator()  # its cpu accelerator counts LOCAL_SIZE, else NUMA nodes
        return int(acc.device_count()) if acc.is_available() else 0
    import torch

    return int(torch.accelerator.device_count()) if torch.accelerator.is_available() else 0


class _DeepSpeed(Dialect):
    """What DeepSpeed's ``DistributedExec._launch_procs``/``_dist_run`` do in each
    launched process before the method, read from the test's class: the device-count
    skip, ``LOCAL_SIZE`` (with ``set_dist_env``), ``deepspeed.init_distributed`` on the
    cell's group (where DeepSpeed is installed) and a barrier (with
    ``init_distributed``; a class without it runs natively: see the dialects)."""

    name = "deepspeed"

    @contextlib.contextmanager
    def around(self, item: Any, cell: CellContext) -> Iterator[None]:
        import torch.distributed as dist

        cls = item.cls
        rank, size = dist.get_rank(), dist.get_world_size()
        fn = item.obj

        # Counted as the launcher counts, in its own environment: before LOCAL_SIZE is
        # set for the launched processes (DeepSpeed's cpu accelerator counts LOCAL_SIZE).
        deepspeed = _deepspeed_module()
        count = _accelerator_count(deepspeed)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            import pytest

            if count and count < size:
                pytest.skip("Skipping test because not enough GPUs are available: "
                            f"{size} required, {count} available")
            if getattr(cls, "init_distributed", True):
                if deepspeed is not None:
                    deepspeed.init_distributed(dist_backend=dist.get_backend(),
                                               rank=rank, world_size=size)
                dist.barrier()
            return fn(*args, **kwargs)

        item.obj = run
        extra = {"LOCAL_SIZE": str(size)} if getattr(cls, "set_dist_env", True) else {}
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


_DIALECTS: dict[str, Dialect] = {d.name: d for d in (Dialect(), _Torch(), _TorchContinuous(),
                                                     _DeepSpeed())}


def dialect_of(name: str) -> Dialect:
    """The in-rank behaviour of a dialect."""
    return _DIALECTS.get(name, _DIALECTS["marker"])


def step_aside_launchers(config: Any, items: Iterable[Any], nodeids: set[str]) -> int:
    """For the tests ``nodeids`` (the DeepSpeed-style ones), skip every non-wrapper
    ``pytest_runtest_call`` of a conftest: the hook that would launch their processes.

    Returns how many hook implementations were wrapped.
    """
    wanted = {i.nodeid for i in items if i.nodeid in nodeids}
    if not wanted:
        return 0
    wrapped = 0
    for impl in config.pluginmanager.hook.pytest_runtest_call.get_hookimpls():
        if impl.hookwrapper or getattr(impl, "wrapper", False):
            continue
        if os.path.basename(getattr(impl.plugin, "__file__", "") or "") != "conftest.py":
            continue
        at = impl.argnames.index("item") if "item" in impl.argnames else -1
        if at < 0:
            continue
        original = impl.function

        def guarded(*args: Any, _original: Any = original, _at: int = at) -> Any:
            if args[_at].nodeid in wanted:
                return None
            return _original(*args)

        impl.function = guarded
        wrapped += 1
    return wrapped


def _groups() -> set[Any]:
    import torch.distributed as dist

    if not dist.is_initialized():
        return set()
    return set(dist.distributed_c10d._world.pg_map)


@contextlib.contextmanager
def _group_shims(module: Any) -> Iterator[Callable[[Any], None]]:
    """``init_process_group`` joins the cell's group; destroying the default group is a
    no-op; both put back afterwards (in ``torch.distributed``, its ``distributed_c10d``
    and the test's module where it imported them by name). Yields the real destroy."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    real_init, real_destroy = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            real_init(*args, **kwargs)
            return
        size, rank = dist.get_world_size(), dist.get_rank()
        want_size = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
        want_rank = kwargs.get("rank", args[4] if len(args) > 4 else -1)
        if want_size not in (-1, None, size) or want_rank not in (-1, None, rank):
            raise RuntimeError(
                f"cpmatrix: the test initializes a process group of {want_size} ranks as "
                f"rank {want_rank}, but it runs in a cell of {size} ranks as rank {rank}")

    def destroy_process_group(group: Any = None) -> None:
        if group is None or group is dist.group.WORLD or (
                dist.is_initialized() and group is c10d._get_default_group()):
            return  # the cell's group belongs to the world, not to the test
        real_destroy(group)

    places: list[tuple[Any, str, Any]] = []
    for owner in (dist, c10d, module):
        if owner is None:
            continue
        for name, real, shim in (("init_process_group", real_init, init_process_group),
                                 ("destroy_process_group", real_destroy,
                                  destroy_process_group)):
            if getattr(owner, name, None) is real:
                places.append((owner, name, real))
                setattr(owner, name, shim)
    try:
        yield real_destroy
    finally:
        for owner, name, real in places:
            setattr(owner, name, real)


#: How many times this rank began each cell (a cell rerun in the same world counts again;
#: every rank of a cell begins it alike, so the count agrees across them).
_BEGUN: dict[str, int] = {}


@contextlib.contextmanager
def _store_namespace(cell: CellContext) -> Iterator[None]:
    """The test's own namespace of the default group's store: what the groups it makes
    write there (a ``new_group(..., use_local_synchronization=True)`` is named by its
    ranks, the same name in every test: its peers' addresses) is never read by a later
    test, as natively each test's processes have a fresh store."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    if not dist.is_initialized():
        yield
        return
    pg = c10d._get_default_group()
    backend, store = c10d._world.pg_map[pg]
    n = _BEGUN[cell.id] = _BEGUN.get(cell.id, 0) + 1
    c10d._world.pg_map[pg] = (backend, c10d.PrefixStore(f"cpmatrix/{cell.id}/{n}", store))
    try:
        yield
    finally:
        if pg in c10d._world.pg_map:
            c10d._world.pg_map[pg] = (backend, store)


def _destroyer(real_destroy: Callable[[Any], None]) -> Callable[[Any], None]:
    """How a group the test made is destroyed: through DeepSpeed's own
    ``deepspeed.comm.destroy_process_group`` where the test initialized DeepSpeed's comm,
    else torch's. DeepSpeed keeps the groups it makes in module globals
    (``deepspeed.utils.groups``: the world group's clone ``deepspeed.initialize``
    broadcasts on) and forgets one only when it is destroyed through its comm; destroyed
    behind its back, the next test in this rank would get the dead group ("Group ... is
    not registered"), where natively each test has fresh processes."""
    comm = sys.modules.get("deepspeed.comm")
    ds_destroy = getattr(comm, "destroy_process_group", None)
    ds_initialized = getattr(comm, "is_initialized", None)
    try:
        use_ds = callable(ds_destroy) and callable(ds_initialized) and bool(ds_initialized())
    except Exception:
        use_ds = False
    if not use_ds:
        return real_destroy
    assert callable(ds_destroy)

    def destroy(group: Any) -> None:
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            ds_destroy(group)
        if group in dist.distributed_c10d._world.pg_map:  # its comm did not: torch's
            real_destroy(group)

    return destroy


@contextlib.contextmanager
def in_test(item: Any, cell: CellContext, dialect: Dialect, *, workdir: str) -> Iterator[None]:
    """Around one test in a rank: the folder, the group shims, the dialect's setup, and
    afterwards the groups the test made destroyed."""
    cwd = os.getcwd()
    before = _groups()
    os.chdir(workdir)
    try:
        with _store_namespace(cell), \
                _group_shims(getattr(item, "module", None)) as real_destroy, \
                dialect.around(item, cell):
            try:
                yield
            finally:
                made = [g for g in _groups() - before]
                destroy = _destroyer(real_destroy) if made else real_destroy
                for group in made:
                    with contextlib.suppress(Exception):
                        destroy(group)
                if made:
                    clear_dtensor_caches()
    finally:
        os.chdir(cwd)
