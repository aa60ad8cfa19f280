"""The pytest plugin (``pytest11`` entry point ``cpmatrix``): inert until ``--cpmatrix``.

Always (so a suite written for it collects with ``--strict-markers`` either way): the
markers ``world`` and ``isolated_world``, and the fixtures ``rank``, ``world_size``,
``mesh`` and ``cell`` for tests marked ``@pytest.mark.world(...)``. Without
``--cpmatrix`` such a test runs only under ``torchrun --nproc-per-node N -m pytest`` with
the size it asks for (its default group made from torchrun's variables) and is skipped
otherwise, saying how to run it.

With ``--cpmatrix`` (:class:`~cpmatrix.kinds.pytest.controller.Controller`): the
multi-rank tests of the run execute in cpmatrix's persistent worlds and every other test
runs as usual. pytest-xdist's ``-n`` is refused: the worlds already run tests side by
side.

Example::

    $ pytest --cpmatrix tests/distributed -k "not slow" --junitxml=report.xml
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from cpmatrix.module_names import PYTEST_RANK

__all__ = ["cell", "mesh", "rank", "world_size"]

_MARKERS = (
    "world(size, dims=None): run the test on every rank of a world of `size` ranks (4) or "
    "of a mesh ('2x2'); fixtures rank, world_size, mesh and cell (cpmatrix)",
    "isolated_world: run this multi-rank test in a world of its own, shared with no other "
    "test (cpmatrix)",
)
_TIMEOUT_MARKER = ("timeout(seconds): fail the test when it runs longer (read by cpmatrix "
                   "for multi-rank tests when pytest-timeout is not installed)")


def pytest_addoption(parser: Any) -> None:
    # Here, not at the top: the plugin loads in every pytest run, --cpmatrix or not.
    from cpmatrix.kinds.pytest.options import add_front_options

    add_front_options(parser.getgroup("cpmatrix",
                                      "multi-rank tests in cpmatrix's persistent worlds"))


def _xdist_asked(config: Any) -> bool:
    if hasattr(config, "workerinput"):
        return True
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) or getattr(config.option, "dist", "no") not in ("no", None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    for line in _MARKERS:
        config.addinivalue_line("markers", line)
    if _in_rank() and not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", _TIMEOUT_MARKER)  # a rank runs without it
    if not config.getoption("cpmatrix", False):
        return
    if _xdist_asked(config):
        raise pytest.UsageError(
            "--cpmatrix cannot be combined with pytest-xdist (-n/--dist): cpmatrix's "
            "worlds already run multi-rank tests side by side on their ranks. Drop -n, or "
            "run without --cpmatrix (pytest -n N runs the tests natively)")
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", _TIMEOUT_MARKER)
    config.pluginmanager.register(_controller(config), "cpmatrix-controller")


#: pytest options with which no test runs (no world, so no spare launcher).
_RUNS_NOTHING = ("collectonly", "help", "version", "showfixtures", "show_fixtures_per_test",
                 "markers")


def _controller(config: Any) -> Any:
    from cpmatrix.defaults import TIMEOUT_S
    from cpmatrix.errors import UsageError
    from cpmatrix.kinds.pytest.adapter import FrontSettings, platform_for, start_spare
    from cpmatrix.kinds.pytest.controller import Controller
    from cpmatrix.kinds.pytest.options import FrontOptions
    from cpmatrix.supervise.options import RunOptions
    from cpmatrix.supervise.runners.local import LocalRunner

    front = FrontOptions.from_pytest(config.getoption)
    try:
        options = RunOptions.from_pytest(
            config.getoption, no_cache=not front.cache, plain=True)
    except UsageError as exc:
        raise pytest.UsageError(f"cpmatrix: {exc}") from None
    out = front.out
    out_path = Path(out).resolve() if out else Path(config.rootpath, ".cpmatrix", "pytest")
    settings = FrontSettings(out=out_path, rootdir=Path(config.rootpath), options=options)
    # The local runner can write the user's cache folder (a sandbox or container cannot).
    user_cache = options.runner == LocalRunner.name
    device = front.device
    # The first world's launcher starts now, before torch is imported here: its imports
    # run while this process collects (a run without multi-rank tests kills it).
    runs = not any(config.getoption(o, False) for o in _RUNS_NOTHING)
    spare = start_spare(settings, platform_for("cpu", os.environ, user_cache=user_cache)) \
        if device != "cuda" and runs else None
    if spare is not None:
        config.add_cleanup(spare.close)  # whatever fails after this point
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    timeout = front.timeout
    if timeout is None:
        native = config.getoption("timeout", None)  # pytest-timeout's --timeout / ini
        timeout = float(native) if native else float(TIMEOUT_S)
    platform = platform_for(device, os.environ, user_cache=user_cache)
    return Controller(config, settings, platform, timeout_s=max(1, math.ceil(timeout)),
                      spare=spare)


def pytest_report_header(config: Any) -> str | None:
    if not config.getoption("cpmatrix", False):
        return None
    return ("cpmatrix: multi-rank tests run in persistent worlds "
            f"({config.getoption('cpmatrix_launcher')} launcher, "
            f"{config.getoption('cpmatrix_runner')} runner)")


def pytest_terminal_summary(terminalreporter: Any, config: Any) -> None:
    controller = config.pluginmanager.get_plugin("cpmatrix-controller")
    line = controller.summary_line() if controller is not None else ""
    if line:
        terminalreporter.write_line(line)


# ------------------------------------------------------------------- native runs

def _in_rank() -> bool:
    rank_module = sys.modules.get(PYTEST_RANK)
    return rank_module is not None and getattr(rank_module, "_SESSION", None) is not None


def _torchrun_size() -> int | None:
    if "TORCHELASTIC_RUN_ID" not in os.environ and "MASTER_PORT" not in os.environ:
        return None
    try:
        return int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: Any) -> None:
    """A ``world``-marked test outside cpmatrix: under a torchrun of its size, with the
    default group made once; else skipped, saying how to run it."""
    mark = item.get_closest_marker("world")
    if mark is None or _in_rank():
        return
    from cpmatrix.kinds.pytest.dialects import DialectError, placement

    try:
        found = placement(item)
    except DialectError as exc:
        pytest.fail(str(exc), pytrace=False)
    assert found is not None
    from cpmatrix.matrix.schema import Mesh

    need = Mesh.parse(found.meshes[0]).world_size
    have = _torchrun_size()
    if have is None:
        pytest.skip(f"needs a world of {need} ranks: run with pytest --cpmatrix (or under "
                    f"torchrun --nproc-per-node {need} -m pytest)")
    if have != need:
        pytest.skip(f"needs a world of {need} ranks; this torchrun has {have}")
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group()


# ----------------------------------------------------------------------- fixtures

@pytest.fixture
def cell(request: Any) -> Any:
    """The test's :class:`cpmatrix.cell.CellContext` (its rank, seed, generator, device,
    folder, ``record``); under torchrun, one made alike."""
    from cpmatrix.kinds.pytest.rank_session import current_cell

    found = current_cell()
    if found is not None:
        return found
    return _native_cell(request)


def _native_cell(request: Any) -> Any:
    """Under a plain torchrun: no matrix cell exists, so the test's spec is made from the
    live world (:meth:`CellSpec.of_world`) and converted as any rank converts its cell."""
    import torch
    import torch.distributed as dist

    from cpmatrix.cell import TORCH_DTYPES, CellContext, seed_for
    from cpmatrix.worker.protocol import CellSpec

    if not dist.is_initialized():
        pytest.skip("the cell fixture needs a world: run with pytest --cpmatrix")
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    folder = request.getfixturevalue("tmp_path")
    spec = CellSpec.of_world(request.node.nodeid, world_size=dist.get_world_size(),
                             platform=device.type, out_dir=str(folder))
    seed = seed_for(spec.id, spec.run_number)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return CellContext.from_spec(spec, rank=dist.get_rank(), mesh=None, device=device,
                                 backend=dist.get_backend(),
                                 dtype=getattr(torch, TORCH_DTYPES[spec.dtype]), seed=seed,
                                 generator=generator, out_dir=folder)


@pytest.fixture
def rank() -> int:
    """This process's rank in the test's world."""
    import torch.distributed as dist

    if not dist.is_initialized():
        pytest.skip("the rank fixture needs a world: run with pytest --cpmatrix")
    return int(dist.get_rank())


@pytest.fixture
def world_size() -> int:
    """The number of ranks of the test's world."""
    import torch.distributed as dist

    if not dist.is_initialized():
        pytest.skip("the world_size fixture needs a world: run with pytest --cpmatrix")
    return int(dist.get_world_size())


@pytest.fixture
def mesh(request: Any) -> Any:
    """A DeviceMesh over the test's world, of the shape its ``world`` marker names
    (``world(4)``: 1-D, dim ``cp0``; ``world("2x2")``: 2-D, dims ``cp0``, ``cp1``; or
    ``dims=``). Its groups are destroyed after the test."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from cpmatrix.cell import MESH_DIMS
    from cpmatrix.kinds.pytest.dialects import placement
    from cpmatrix.kinds.pytest.rank_session import current_cell
    from cpmatrix.matrix.schema import Mesh

    found = placement(request.node)
    if found is None or not dist.is_initialized():
        pytest.skip("the mesh fixture needs a test marked @pytest.mark.world(...) in a world")
    grid = Mesh.parse(found.meshes[0])
    shape = (grid.cols,) if len(found.dims) == 1 else (grid.rows, grid.cols)
    here = current_cell()
    if here is not None and here.mesh is not None and found.dims == MESH_DIMS and \
            tuple(here.mesh.shape) == shape:
        yield here.mesh  # the cell's own mesh: built once per world and shape
        return
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    made = init_device_mesh(device, shape, mesh_dim_names=found.dims)
    yield made
    for dim in found.dims:
        group = made.get_group(dim)
        if group is not None and group is not dist.group.WORLD and \
                group is not dist.distributed_c10d._get_default_group():
            dist.destroy_process_group(group)
