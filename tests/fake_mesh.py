"""Fakes for the parity checks' unit tests: a mesh, a DTensor and a threaded world.

- :class:`FakeMesh` has what the checks read of a ``DeviceMesh``: ``shape``, ``ndim``,
  ``size(dim)``, ``mesh_dim_names``, ``mesh`` (its global ranks), ``get_group(dim)`` and
  ``get_coordinate()``; ``mesh["cp1"]`` and :meth:`FakeMesh.flatten` derive sub-meshes
  and flattened meshes through this rank, as ``DeviceMesh`` does.
- :class:`FakeDTensor` duck-types a ``DTensor``: global ``shape``, ``placements`` (real
  ``Shard``/``Replicate``/``Partial`` objects), ``device_mesh`` (None: the cell's),
  ``to_local()`` and ``full_tensor()``.
- :class:`FakeWorld` runs one function per rank in threads and stands in for the few
  ``torch.distributed`` calls of :mod:`cpmatrix.parity.checks` (``all_gather_object``,
  ``all_gather``, ``get_process_group_ranks``) with an in-memory rendezvous per group.
  The checks' collective code then runs end to end, every rank with its own values, in
  milliseconds; the real gloo collectives stay covered by ``test_parity_worlds.py``.
"""

from __future__ import annotations

import itertools
import math
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")

#: Seconds a rank waits for the others in one collective: a check whose ranks issue
#: different collectives (a deadlock on a real world) fails the test instead of hanging.
RENDEZVOUS_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class FakeGroup:
    """A process group: its global ranks, in group order."""

    ranks: tuple[int, ...]


class FakeMesh:
    """A row-major mesh of ``shape`` seen from ``rank`` (default 0)."""

    def __init__(self, shape: Sequence[int], names: Sequence[str] | None = ("cp0", "cp1"),
                 rank: int = 0, ranks: torch.Tensor | None = None) -> None:
        self._shape = tuple(int(s) for s in shape)
        self.mesh_dim_names = None if names is None else tuple(names)[: len(self._shape)]
        self.rank = rank
        self._coords = list(itertools.product(*(range(s) for s in self._shape)))
        #: The global rank at each coordinate (row-major ``arange`` unless given).
        self.mesh = (torch.arange(math.prod(self._shape)).reshape(self._shape)
                     if ranks is None else ranks.reshape(self._shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def __getitem__(self, names: str | tuple[str, ...]) -> FakeMesh:
        """The sub-mesh over ``names`` through this rank (``DeviceMesh.__getitem__``)."""
        wanted = (names,) if isinstance(names, str) else tuple(names)
        assert self.mesh_dim_names is not None
        dims = [self.mesh_dim_names.index(n) for n in wanted]
        mine = self.get_coordinate()
        index = tuple(slice(None) if d in dims else mine[d] for d in range(self.ndim))
        kept = sorted(dims)
        sub = self.mesh[index].permute(*[kept.index(d) for d in dims])
        return self._through_me(sub, wanted)

    def flatten(self, name: str | None = None) -> FakeMesh:
        """This mesh as one dim (``DeviceMesh._flatten``), named ``cp0_cp1`` by default."""
        names = self.mesh_dim_names or ()
        return self._through_me(self.mesh.reshape(-1), (name or "_".join(names),))

    def _through_me(self, ranks: torch.Tensor, names: tuple[str, ...]) -> FakeMesh:
        me = int(self.mesh[self.get_coordinate()])
        at = int((ranks.reshape(-1) == me).nonzero()[0])
        return FakeMesh(tuple(ranks.shape), names, rank=at, ranks=ranks)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def size(self, mesh_dim: int | None = None) -> int:
        return math.prod(self._shape) if mesh_dim is None else self._shape[mesh_dim]

    def get_coordinate(self) -> tuple[int, ...]:
        return self._coords[self.rank]

    def get_group(self, mesh_dim: int) -> FakeGroup:
        """The ranks that share every coordinate of this rank but ``mesh_dim``."""
        mine = self.get_coordinate()
        return FakeGroup(tuple(
            r for r, c in enumerate(self._coords)
            if all(c[d] == mine[d] for d in range(self.ndim) if d != mesh_dim)
        ))


class FakeDTensor(torch.Tensor):
    """A tensor that looks like a DTensor to the checks (no process group needed)."""

    placements: tuple[Any, ...]
    device_mesh: Any
    _local: torch.Tensor
    _full: torch.Tensor | None

    @staticmethod
    def __new__(cls, local: torch.Tensor, placements: Sequence[Any],
                global_shape: Sequence[int] | None = None,
                full: torch.Tensor | None = None, mesh: Any = None) -> FakeDTensor:
        shape = tuple(global_shape) if global_shape is not None else (
            tuple(full.shape) if full is not None else tuple(local.shape))
        meta = torch.empty(shape, dtype=local.dtype, device="meta")
        t: FakeDTensor = torch.Tensor._make_subclass(cls, meta)
        t._local, t.placements, t._full = local, tuple(placements), full
        t.device_mesh = mesh
        return t

    def to_local(self) -> torch.Tensor:
        return self._local

    def full_tensor(self) -> torch.Tensor:
        assert self._full is not None, "give full= to a FakeDTensor read through full_tensor()"
        return self._full


class _Room:
    """One group's rendezvous: every rank drops its value, then all read them all."""

    def __init__(self, size: int) -> None:
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=RENDEZVOUS_TIMEOUT_S)


class FakeWorld:
    """``torch.distributed`` for the ranks of a fake mesh, each rank a thread.

    Patch it in as the checks module's ``dist`` and call :meth:`run`::

        world = FakeWorld((2, 2))
        monkeypatch.setattr(checks, "dist", world)
        results = world.run(lambda mesh: checks.replicated_problems(values, mesh))
    """

    def __init__(self, shape: Sequence[int], names: Sequence[str] | None = ("cp0", "cp1")):
        self.shape = tuple(shape)
        self.names = names
        self.size = math.prod(self.shape)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._rooms: dict[tuple[int, ...], _Room] = {}
        #: rank -> (operation, group ranks) of each collective it issued, in order.
        self.calls: dict[int, list[tuple[str, tuple[int, ...]]]] = {
            r: [] for r in range(self.size)}

    # -- the torch.distributed calls the checks make ------------------------------------

    def all_gather_object(self, object_list: list[Any], obj: Any, group: FakeGroup) -> None:
        self._check_len("all_gather_object", object_list, group)
        # pickled, as torch does: a rank cannot see another rank's object itself
        sent = self._exchange("all_gather_object", group, pickle.dumps(obj))
        object_list[:] = [pickle.loads(s) for s in sent]

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                   group: FakeGroup) -> None:
        self._check_len("all_gather", tensor_list, group)
        sent = self._exchange("all_gather", group, tensor.detach().clone())
        for out, value in zip(tensor_list, sent, strict=True):
            if out.shape != value.shape or out.dtype != value.dtype:
                raise RuntimeError(f"all_gather: rank buffers differ: {out.shape}/{out.dtype} "
                                   f"vs {value.shape}/{value.dtype}")
            out.copy_(value)

    def get_process_group_ranks(self, group: FakeGroup) -> list[int]:
        return list(group.ranks)

    def get_world_size(self, group: FakeGroup | None = None) -> int:
        return self.size if group is None else len(group.ranks)

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    # -- running ranks -----------------------------------------------------------------

    def mesh(self, rank: int) -> FakeMesh:
        return FakeMesh(self.shape, self.names, rank)

    def run(self, fn: Callable[[FakeMesh], T]) -> list[T]:
        """``fn(mesh)`` on every rank at once; the results by rank (a rank's error raises)."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException | None] = [None] * self.size

        def rank_main(rank: int) -> None:
            self._local.rank = rank
            try:
                results[rank] = fn(self.mesh(rank))
            except BaseException as exc:  # re-raised in the test's thread below
                errors[rank] = exc
                for room in list(self._rooms.values()):
                    room.barrier.abort()  # the others must not wait for this rank

        # daemons: a rank that hangs fails the test below and cannot keep pytest alive
        threads = [threading.Thread(target=rank_main, args=(r,), daemon=True)
                   for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=4 * RENDEZVOUS_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads), "a fake rank hung"
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return results

    def _check_len(self, op: str, out: list[Any], group: FakeGroup) -> None:
        if len(out) != len(group.ranks):
            raise ValueError(f"{op}: output list has {len(out)} slots for a group of "
                             f"{len(group.ranks)} ranks")

    def _exchange(self, op: str, group: FakeGroup, value: Any) -> list[Any]:
        rank = self._local.rank
        self.calls[rank].append((op, group.ranks))
        with self._lock:
            room = self._rooms.setdefault(group.ranks, _Room(len(group.ranks)))
        room.slots[group.ranks.index(rank)] = value
        room.barrier.wait()
        sent = list(room.slots)
        room.barrier.wait()  # nobody refills the room before everyone has read it
        return sent
