"""The inventory of process-wide settings, the namespace watch and the per-cell environment
(worker/inventory.py, worker/namespaces.py, worker/cellenv.py), in this process.

Each test changes something process-wide the way a case would and checks that it is put
back (or reported); the worlds that do the same between real cells are in
tests/worlds/test_isolation.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from cpmatrix.worker.cellenv import c_environ, cell_env
from cpmatrix.worker.inventory import Inventory, settings
from cpmatrix.worker.namespaces import NamespaceWatch, version_tags_work

DOCS = Path(__file__).resolve().parents[2] / "docs" / "running.md"


def test_every_setting_of_the_inventory_is_in_the_docs() -> None:
    """docs/running.md lists the inventory: a setting added in code must be documented."""
    text = DOCS.read_text()
    missing = [s.name for s in settings() if s.name.split(" (")[0] not in text
               and not s.name.startswith("torch flag ")]  # enumerated: test_torch_flags.py
    assert not missing, f"docs/running.md does not list: {missing}"


def test_restorable_settings_are_put_back() -> None:
    import numpy as np
    import torch

    inv = Inventory(settings())
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(old_limit + 11)
    np.seterr(all="raise")
    handler = signal.signal(signal.SIGUSR2, lambda *_: None)
    torch.set_flush_denormal(True)
    torch.set_default_dtype(torch.float64)
    torch.autocast("cpu").__enter__()
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    Mode().__enter__()
    assert inv.after_cell() == []
    assert sys.getrecursionlimit() == old_limit
    assert np.geterr()["over"] == "warn"
    assert signal.getsignal(signal.SIGUSR2) is handler
    assert float(torch.tensor([1e-40], dtype=torch.float32).mul(1.0)[0]) != 0.0
    assert torch.get_default_dtype() is torch.float32
    assert not torch.is_autocast_enabled("cpu")
    assert torch._C._len_torch_function_stack() == 0


def test_what_cannot_be_put_back_is_reported() -> None:
    import torch

    inv = Inventory(settings())
    with torch.inference_mode():
        problems = inv.after_cell()
    assert any("torch inference mode" in p and "cannot be put back" in p for p in problems)
    assert inv.after_cell() == []


@pytest.fixture
def watch() -> NamespaceWatch:
    """A snapshot taken in this test (pytest changes ``warnings`` between tests)."""
    import numpy  # noqa: F401 - loaded before the snapshot, as in a world
    import torch.distributed.tensor  # noqa: F401

    return NamespaceWatch(project_roots=("/nonexistent-cpmatrix-project",))


def test_the_version_tags_are_read_here() -> None:
    assert version_tags_work(), "CPython 3.11-3.13 on 64 bits: the fast path must work"


@pytest.mark.parametrize("patch", ["module", "class", "delete", "cpmatrix data"])
def test_a_patch_is_reported_and_put_back(watch: NamespaceWatch, patch: str) -> None:
    import numpy as np
    import torch
    from torch.distributed.tensor import DTensor

    import cpmatrix.parity.tolerance as tolerance

    saved_dumps, saved_allclose, saved_words = json.dumps, np.allclose, \
        tolerance.MIN_REASON_WORDS
    watch.before_cell()
    if patch == "module":
        json.dumps = lambda *a, **k: "{}"
        name = "json.dumps"
    elif patch == "class":
        torch.Tensor.add = lambda *a: None  # type: ignore[method-assign]  # shadows TensorBase
        name = "torch.Tensor.add"
    elif patch == "delete":
        del np.allclose
        name = "numpy.allclose"
    else:
        tolerance.MIN_REASON_WORDS = 0  # data, in cpmatrix's own module
        name = "cpmatrix.parity.tolerance.MIN_REASON_WORDS"
    problems = watch.after_cell()
    assert len(problems) == 1 and name in problems[0], problems
    assert json.dumps is saved_dumps and np.allclose is saved_allclose
    assert "add" not in vars(torch.Tensor) and saved_words == tolerance.MIN_REASON_WORDS
    assert DTensor.full_tensor.__module__.startswith("torch")
    assert watch.after_cell() == []


def test_the_record_of_a_cells_uncaught_exception_is_put_back_without_blame(
        watch: NamespaceWatch) -> None:
    # pytest's runner sets sys.last_type/value/traceback for every failing test (the
    # pytest front runs tests in the ranks): a failing test is not a monkeypatching one,
    # and the next cell starts without the record.
    saved = {k: vars(sys).get(k) for k in ("last_type", "last_value", "last_traceback")}
    watch.before_cell()
    try:
        raise ValueError("planted")
    except ValueError as exc:
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    assert watch.after_cell() == []
    assert {k: vars(sys).get(k) for k in saved} == saved
    hook = sys.excepthook
    watch.before_cell()
    sys.excepthook = lambda *a: None  # a real patch of sys is still one
    try:
        assert any("sys.excepthook" in p for p in watch.after_cell())
    finally:
        sys.excepthook = hook


def test_a_librarys_own_updates_are_not_patches(watch: NamespaceWatch) -> None:
    import torch.compiler._cache as cache

    watch.before_cell()
    # A library filling a lazily set global (None -> a class) and registering a property
    # of its own on one of its classes: torch does both on first use.
    cache._cpmatrix_probe = None  # type: ignore[attr-defined]
    assert watch.after_cell() == []
    cache._cpmatrix_probe = type("Lazy", (), {"__module__": "torch.compiler._cache"})  # type: ignore[attr-defined]
    prop = property(lambda self: [])
    prop.fget.__module__ = "torch.compiler._cache"  # type: ignore[union-attr]
    saved = vars(cache.CacheInfo).get("inductor_artifacts")
    cache.CacheInfo.inductor_artifacts = prop  # type: ignore[assignment,method-assign]
    try:
        assert watch.after_cell() == []
    finally:
        cache.CacheInfo.inductor_artifacts = saved  # type: ignore[assignment,method-assign]
        del cache._cpmatrix_probe  # type: ignore[attr-defined]
        watch.after_cell()


def test_a_partial_of_the_original_is_a_patch_and_torchs_own_partials_are_not(
        watch: NamespaceWatch) -> None:
    import functools

    import torch
    import torch.testing

    original = torch.testing.assert_close
    watch.before_cell()
    # torch does this itself when DTensor's placement types load (placement_types.py).
    saved = vars(torch._C._distributed.Placement)["__eq__"]
    torch._C._distributed.Placement.__eq__ = functools.partial(  # type: ignore[method-assign]
        torch.distributed.tensor.placement_types._raise_error, method_name="__eq__")
    try:
        assert watch.after_cell() == []
    finally:
        torch._C._distributed.Placement.__eq__ = saved  # type: ignore[method-assign]
        watch.after_cell()
    torch.testing.assert_close = functools.partial(original, rtol=1.0, atol=1.0)
    problems = watch.after_cell()
    assert len(problems) == 1 and "torch.testing.assert_close" in problems[0], problems
    assert torch.testing.assert_close is original


def test_a_dropped_bundled_package_leaves_cpmatrix_as_it_was() -> None:
    """``cpmatrix.suite`` (bundled cases, a project's own) is dropped after each cell, and
    the ``suite`` attribute its import set on ``cpmatrix`` with it: the next import sets
    it again. Left there, it reads as a new value in cpmatrix's own namespace: a patch."""
    import cpmatrix

    for name in [n for n in sys.modules if n == "cpmatrix.suite" or
                 n.startswith("cpmatrix.suite.")]:
        del sys.modules[name]
    vars(cpmatrix).pop("suite", None)
    watch = NamespaceWatch(project_roots=("/nonexistent-cpmatrix-project",))
    watch.before_cell()
    import cpmatrix.suite  # what a cell of the reference suite does

    assert watch.after_cell() == []
    assert "cpmatrix.suite" not in sys.modules and "suite" not in vars(cpmatrix)


def test_a_restore_that_leaves_the_inherited_method_on_the_class_is_no_patch(
        watch: NamespaceWatch) -> None:
    """``setattr(torch.Tensor, "uniform_", original)`` after a wrapper (what
    ``cpmatrix.parity.rng.RngRecorder`` does) leaves TensorBase's own method in
    ``torch.Tensor``'s dict: the same object, no change in behaviour."""
    import torch

    watch.before_cell()
    inherited = torch.Tensor.uniform_
    torch.Tensor.uniform_ = inherited  # type: ignore[method-assign]
    try:
        assert watch.after_cell() == []
    finally:
        del torch.Tensor.uniform_
        watch.after_cell()


def test_every_self_patching_namespace_is_listed_as_not_covered() -> None:
    from cpmatrix.worker.namespaces import SELF_PATCHING

    section = DOCS.read_text().split("#### Not covered (and why)", 1)[1]
    assert all(f"`{name}`" in section for name in SELF_PATCHING)


def test_an_installed_module_first_imported_by_a_cell_is_not_the_projects(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataclass's generated ``__init__`` has the file name ``<string>``: relative, so
    resolved against the working folder, which lies under the project (the cell's own
    folder below ``--out``). It is not the project's code."""
    project, installed = tmp_path / "project", tmp_path / "site"
    (project / "out" / "cwd").mkdir(parents=True)
    installed.mkdir()
    (installed / "cpmatrix_unit_dc.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass Point:\n    x: int = 0\n")
    monkeypatch.syspath_prepend(str(installed))
    watch = NamespaceWatch(project_roots=(str(project),))
    monkeypatch.chdir(project / "out" / "cwd")
    watch.before_cell()
    import cpmatrix_unit_dc  # noqa: F401

    try:
        assert watch.after_cell() == []
    finally:
        sys.modules.pop("cpmatrix_unit_dc", None)


def test_a_replaced_sys_modules_entry_is_put_back(watch: NamespaceWatch) -> None:
    import torch.testing

    watch.before_cell()
    sys.modules["torch.testing"] = json
    assert watch.after_cell() == []
    assert sys.modules["torch.testing"] is torch.testing


def test_a_cell_gets_the_rank_variables_of_its_own_size() -> None:
    base = {"RANK": "5", "LOCAL_RANK": "5", "WORLD_SIZE": "9", "MASTER_PORT": "1", "TMP": "x",
            "PWD": "/w"}
    cpu = cell_env(base, local=1, size=2, device_index=None, home="/h", tmp="/t", cwd="/c")
    assert {k: cpu[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                                "GROUP_WORLD_SIZE")} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1"}
    assert (cpu["HOME"], cpu["TMPDIR"], cpu["TMP"], cpu["PWD"], cpu["MASTER_PORT"]) == \
        ("/h", "/t", "/t", "/c", "1")
    cuda = cell_env(base, local=1, size=2, device_index=5, home="/h", tmp="/t", cwd="/c")
    assert (cuda["RANK"], cuda["LOCAL_RANK"]) == ("1", "5")  # the device index, on cuda


def test_the_c_environment_is_readable_and_follows_putenv() -> None:
    os.putenv("CPMATRIX_UNIT_PUTENV", "1")
    try:
        native = c_environ()
        assert native is not None and native.get("CPMATRIX_UNIT_PUTENV") == "1"
        assert "CPMATRIX_UNIT_PUTENV" not in os.environ
    finally:
        os.unsetenv("CPMATRIX_UNIT_PUTENV")


def test_the_docs_list_no_uncovered_item_without_a_reason() -> None:
    """The guarantees' "Not covered" list: each item says why it cannot be covered."""
    text = DOCS.read_text()
    section = text.split("#### Not covered (and why)", 1)[1].split("\n#", 1)[0]
    items = re.split(r"\n- ", "\n" + section.strip())[1:]
    assert items, "the list is there"
    for item in items:
        assert "why:" in item, item
