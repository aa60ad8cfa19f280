"""Which collected tests need ranks, and how many: every dialect, read without a world.

The items are stand-ins for pytest's (a node id, the class, the instance and the
markers); the classes are real: torch's own harness, subclassed as its users do.
"""

from __future__ import annotations

from typing import Any

import pytest
from torch.testing._internal.common_distributed import (
    MultiProcContinuousTest,
    MultiProcessTestCase,
    MultiThreadedTestCase,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    DTensorOpTestBase,
    DTensorTestBase,
    LocalDTensorContinuousTestBase,
    create_local_tensor_test_class,
)

from cpmatrix.kinds.pytest.dialects import DialectError, Placement, placement


class Mark:
    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.name, self.args, self.kwargs = name, args, kwargs


class Item:
    def __init__(self, *marks: Mark, cls: type | None = None, name: str = "test_x") -> None:
        self.marks = {m.name: m for m in marks}
        self.cls = cls
        self.name = name
        self.nodeid = f"t.py::{cls.__name__ + '::' if cls else ''}{name}"
        self._instance: Any = None

    def get_closest_marker(self, name: str) -> Mark | None:
        return self.marks.get(name)

    @property
    def instance(self) -> Any:
        if self._instance is None and self.cls is not None:
            self._instance = self.cls(self.name)
        return self._instance


# ------------------------------------------------------------------------- marker

@pytest.mark.parametrize(("args", "kwargs", "meshes", "dims"), [
    ((4,), {}, ("1x4",), ("cp0",)),
    (("2x2",), {}, ("2x2",), ("cp0", "cp1")),
    (("2x3",), {"dims": ("dp", "tp")}, ("2x3",), ("dp", "tp")),
    ((2,), {"dims": "ranks"}, ("1x2",), ("ranks",)),
])
def test_world_marker(args: tuple[Any, ...], kwargs: dict[str, Any], meshes: tuple[str, ...],
                      dims: tuple[str, ...]) -> None:
    found = placement(Item(Mark("world", *args, **kwargs)))
    assert found == Placement("marker", meshes, dims=dims)


@pytest.mark.parametrize(("args", "kwargs", "fragment"), [
    ((0,), {}, "a world has 1 to 64 ranks"),
    ((65,), {}, "a world has 1 to 64 ranks"),
    (("2by2",), {}, "a mesh 'RxC'"),
    (("9x9",), {}, "81 ranks, more than 64"),
    ((True,), {}, "expected a number of ranks"),
    ((), {}, "takes one size or mesh"),
    ((2, 3), {}, "takes one size or mesh"),
    ((2,), {"size": 2}, "takes one size or mesh"),
    (("2x2",), {"dims": ("a",)}, "2 distinct names"),
    (("2x2",), {"dims": ("a", "a")}, "2 distinct names"),
])
def test_bad_world_markers_name_the_test_and_the_fix(args: tuple[Any, ...],
                                                     kwargs: dict[str, Any],
                                                     fragment: str) -> None:
    with pytest.raises(DialectError) as info:
        placement(Item(Mark("world", *args, **kwargs)))
    assert str(info.value).startswith("t.py::test_x: ")
    assert fragment in str(info.value)


def test_timeouts_and_isolation() -> None:
    found = placement(Item(Mark("world", 2), Mark("timeout", 7.2), Mark("isolated_world")))
    assert found is not None and (found.timeout_s, found.isolated) == (8, True)
    found = placement(Item(Mark("world", 2), Mark("timeout", timeout=30)))
    assert found is not None and found.timeout_s == 30
    with pytest.raises(DialectError, match="timeout marker 'soon'"):
        placement(Item(Mark("world", 2), Mark("timeout", "soon")))


def test_tests_without_ranks_run_as_usual() -> None:
    class Plain:
        def test_x(self) -> None: ...

    assert placement(Item()) is None
    assert placement(Item(Mark("timeout", 3))) is None
    assert placement(Item(cls=Plain)) is None


# -------------------------------------------------------------------------- torch
# Each class below is torch's harness as its users subclass it; `__test__ = False` keeps
# this pytest run from collecting (and spawning) them.

class Quad(DTensorTestBase):
    __test__ = False

    def test_x(self) -> None: ...


class Pair(DTensorTestBase):
    __test__ = False

    @property
    def world_size(self) -> int:
        return 2

    def test_x(self) -> None: ...


class Triple(MultiProcessTestCase):
    __test__ = False

    world_size = 3  # a class attribute shadowing the harness's property

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_x(self) -> None: ...


class Continuous(DTensorContinuousTestBase):
    __test__ = False

    world_size = 2

    def test_x(self) -> None: ...


class ContinuousByProperty(MultiProcContinuousTest):
    __test__ = False

    @property
    def world_size(self) -> int:
        return 3

    def test_x(self) -> None: ...


class ContinuousUnset(MultiProcContinuousTest):
    __test__ = False

    def test_x(self) -> None: ...


class OneProcessThreads(MultiThreadedTestCase):
    __test__ = False

    def test_x(self) -> None: ...


class OneProcessLocal(LocalDTensorContinuousTestBase):
    __test__ = False

    def test_x(self) -> None: ...


@pytest.mark.parametrize(("cls", "dialect", "mesh"), [
    (Quad, "torch", "1x4"),  # DTensorTestBase's own default on a CPU machine
    (Pair, "torch", "1x2"),
    (Triple, "torch", "1x3"),
    (Continuous, "torch_continuous", "1x2"),
    (ContinuousByProperty, "torch_continuous", "1x3"),
    (ContinuousUnset, "torch_continuous", "1x1"),  # the device count of the CPU
])
def test_torch_harness_world_sizes(cls: type, dialect: str, mesh: str) -> None:
    found = placement(Item(cls=cls))
    assert found is not None
    assert (found.dialect, found.meshes) == (dialect, (mesh,))
    assert found.timeout_s == 300  # torch's own per-test default (TIMEOUT_DEFAULT)


class NeverSpawns(MultiProcessTestCase):
    """Its setUp starts no processes: natively its tests run in the pytest process."""

    __test__ = False

    def test_x(self) -> None: ...


class SpawnsInItsOwnSetUp(MultiProcessTestCase):
    __test__ = False

    world_size = 2

    def setUp(self) -> None:
        super().setUp()
        self._prepare()

    def _prepare(self) -> None:
        self._spawn_processes()

    def test_x(self) -> None: ...


OneProcessLocalTensor = create_local_tensor_test_class(Pair)
OneProcessLocalTensor.__test__ = False


def test_a_class_that_spawns_through_its_own_methods_is_multi_rank() -> None:
    found = placement(Item(cls=SpawnsInItsOwnSetUp))
    assert found is not None and (found.dialect, found.meshes) == ("torch", ("1x2",))


@pytest.mark.parametrize("cls", [OneProcessThreads, OneProcessLocal, OneProcessLocalTensor,
                                 NeverSpawns, DTensorOpTestBase])
def test_torch_single_process_harnesses_run_as_usual(cls: type) -> None:
    assert placement(Item(cls=cls)) is None


def test_a_marker_wins_over_the_harness_and_a_timeout_marker_over_torchs_table() -> None:
    found = placement(Item(Mark("timeout", 9), cls=Pair))
    assert found is not None and found.timeout_s == 9
    # A world marker on a harness test: the marker's world, not the harness's 2 ranks.
    marked = placement(Item(Mark("world", 4), cls=Pair))
    assert marked is not None and (marked.dialect, marked.meshes) == ("marker", ("1x4",))


def test_an_unreadable_world_size_names_the_test() -> None:
    class Broken(DTensorTestBase):
        __test__ = False

        @property
        def world_size(self) -> int:
            raise RuntimeError("needs a GPU to tell")

        def test_x(self) -> None: ...

    # It runs as without cpmatrix (torch's harness decides), with a note saying why.
    found = placement(Item(cls=Broken))
    assert found is not None and (found.dialect, found.meshes) == ("native", ())
    assert found.note == ("t.py::Broken::test_x: runs as without cpmatrix: cannot read its "
                          "world_size (RuntimeError: needs a GPU to tell)")


def test_a_world_size_out_of_range_or_a_missing_backend_runs_natively() -> None:
    class Empty(Pair):
        __test__ = False

        @property
        def world_size(self) -> int:
            return 0

    class Nccl(Continuous):
        __test__ = False

        @classmethod
        def backend_str(cls) -> str:
            return "nccl"

    empty = placement(Item(cls=Empty))
    assert empty is not None and empty.dialect == "native"
    assert "world_size 0: a world has 1 to 64 ranks" in empty.note
    nccl = placement(Item(cls=Nccl))
    assert nccl is not None and nccl.dialect == "native"
    assert "pins backend 'nccl', not available here" in nccl.note


# ---------------------------------------------------------------------- deepspeed

@pytest.mark.parametrize(("sizes", "meshes"), [(2, ("1x2",)), ([1, 2, 4], ("1x1", "1x2", "1x4")),
                                               ((2, 2), ("1x2",))])
def test_deepspeed_world_size(sizes: Any, meshes: tuple[str, ...]) -> None:
    cls = type("TestDs", (), {"world_size": sizes, "exec_timeout": 45.5})
    found = placement(Item(cls=cls))
    assert found == Placement("deepspeed", meshes, timeout_s=46)


@pytest.mark.parametrize(("sizes", "fragment"), [([], "at least one world size"),
                                                 ([2, "x"], "world_size 'x'"),
                                                 ([2, 100], "world_size 100")])
def test_bad_deepspeed_world_sizes(sizes: Any, fragment: str) -> None:
    cls = type("TestDs", (), {"world_size": sizes})
    with pytest.raises(DialectError, match=fragment):
        placement(Item(cls=cls))


def test_a_world_size_property_of_a_plain_class_is_not_the_deepspeed_dialect() -> None:
    cls = type("TestP", (), {"world_size": property(lambda self: 2)})
    assert placement(Item(cls=cls)) is None


def test_a_deepspeed_class_without_init_distributed_runs_natively() -> None:
    cls = type("TestNoInit", (), {"world_size": 2, "init_distributed": False})
    found = placement(Item(cls=cls))
    assert found is not None and found.dialect == "native"
    assert "init_distributed = False" in found.note


@pytest.mark.parametrize(("marked", "meshes"), [(1, ("1x1",)), ([2, 4], ("1x2", "1x4"))])
def test_a_methods_world_size_marker_wins_over_the_deepspeed_class(
        marked: Any, meshes: tuple[str, ...]) -> None:
    # DeepSpeed's DistributedTest: @pytest.mark.world_size(N) on a method overrides the
    # class's world_size (its TestWorldSizeOverrideDistTest ran on 2 ranks: assert 2 == 1).
    cls = type("TestDs", (), {"world_size": 2})
    found = placement(Item(Mark("world_size", marked), cls=cls))
    assert found is not None and found.meshes == meshes
