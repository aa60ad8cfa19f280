"""A pytest target's cells: ids, digests over the sources each test depends on, and the
``pytest:`` key of a matrix (its errors name file, line and what is allowed)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmatrix.errors import SpecError
from cpmatrix.kinds.pytest.adapter import platform_for
from cpmatrix.kinds.pytest.sources import SourceDigests
from cpmatrix.kinds.pytest.spec import (
    CASE,
    ISOLATED_TAG,
    PytestSession,
    PytestTest,
    cell_test,
    cells_for,
    slug_of,
)
from cpmatrix.matrix.cellid import parse_cell_id
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import parse_matrix
from cpmatrix.matrix.schema import Cell, Matrix, Platform, Target

CPU = Platform(name="cpu", backend="gloo", device="cpu")
SESSION = PytestSession(dir="/r", args=("tests",), rootdir="/r")


def t(nodeid: str, *meshes: str, **kw: object) -> PytestTest:
    return PytestTest(nodeid=nodeid, file="/r/tests/test_a.py", dialect="marker",
                      meshes=meshes or ("1x2",), **kw)  # type: ignore[arg-type]


def test_cells_ids_parse_back_and_carry_their_test() -> None:
    cells = cells_for([t("tests/test_a.py::test_x[1-2]", "1x2", "2x2", markers=("slow",)),
                       t("tests/test_a.py::test_y", isolated=True, timeout_s=9)],
                      SESSION, platform=CPU, target="suite", timeout_s=120, tags=("front",))
    assert [c.id for c in cells] == [
        "suite[unit,1x2,fp64,autocast=off,reference,test=tests.test_a.py.test_x-1-2]@cpu",
        "suite[unit,2x2,fp64,autocast=off,reference,test=tests.test_a.py.test_x-1-2]@cpu",
        "suite[unit,1x2,fp64,autocast=off,reference,test=tests.test_a.py.test_y]@cpu",
    ]
    for cell in cells:
        key = parse_cell_id(cell.id)
        assert (key.target, key.mesh, key.params) == (cell.target, str(cell.mesh),
                                                      (("test", dict(cell.params)["test"]),))
        assert cell.case == CASE and cell.kind == "pytest"
    assert cell_test(cells[0]) == {"nodeid": "tests/test_a.py::test_x[1-2]", "dialect": "marker",
                                 "session": SESSION.to_json()}
    assert [c.timeout_s for c in cells] == [120, 120, 9]
    assert cells[0].tags == ("front", "slow", "marker")
    assert ISOLATED_TAG in cells[2].tags and ISOLATED_TAG not in cells[0].tags
    assert Cell.from_dict(cells[0].to_dict()) == cells[0]


def test_a_pytest_cells_test_reaches_its_ranks_apart_from_the_users_params(
        tmp_path: Path) -> None:
    """Through the world file a pytest job writes: the test (node id, dialect, session)
    travels in ``CellSpec.pytest``, the case's ``cell.params`` holds only the target's
    axes (docs/running.md), and the rank's session reads each test from there."""
    from cpmatrix.cell import CellContext
    from cpmatrix.kinds.pytest.executor import PytestExecutor
    from cpmatrix.kinds.pytest.rank_session import _RankSession
    from cpmatrix.module_names import PYTEST_PREPARE
    from cpmatrix.supervise.context import RunContext
    from cpmatrix.supervise.entry import Entry
    from cpmatrix.supervise.runners.base import Launch
    from cpmatrix.supervise.runners.local import LocalRunner
    from cpmatrix.worker.protocol import PytestSpec, WorldSpec, read_typed

    class NoLaunch(LocalRunner):  # the world file is written, then nothing starts
        def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
            raise OSError("not started here")

    cells = cells_for([t("tests/test_a.py::test_x"),
                       replace(t("tests/test_a.py::test_y"), dialect="deepspeed")],
                      SESSION, platform=CPU)
    context = RunContext(out_root=tmp_path, runner=NoLaunch(), run_id="r")
    job = PytestExecutor().job("000-w", [Entry(cell=c) for c in cells], CPU, context, ())
    job.start()
    assert job.start_failed  # (nothing ran: the file below is the job's own)
    world = read_typed(job.folder.world_file, WorldSpec, run="r")
    assert world is not None and world.prepare == PYTEST_PREPARE
    for entry, spec in zip(job.entries, world.cells, strict=True):
        ctx = CellContext.from_spec(spec, rank=0, mesh=None, device="cpu", backend="gloo",
                                    dtype=None, seed=0, generator=None, out_dir=tmp_path)
        assert ctx.params == dict(entry.cell.params) == {"test": slug_of(
            cell_test(entry.cell)["nodeid"])}
        assert spec.pytest == PytestSpec(**cell_test(entry.cell))
    ranks = _RankSession(world, 0, list(world.cells))
    assert ranks.by_cell == {e.cell.id: cell_test(e.cell)["nodeid"] for e in job.entries}
    assert ranks.deepspeed == {"tests/test_a.py::test_y"}
    assert ranks.spec.to_json() == SESSION.to_json()


def test_node_ids_that_share_a_slug_get_each_their_own_stable_id() -> None:
    a, b = "tests/test_a.py::test_x[a b]", "tests/test_a.py::test_x[a/b]"
    assert slug_of(a) != slug_of(b)  # (shown: the two map apart already) ...
    c, d = "tests/test_a.py::test_x[a:b]", "tests/test_a.py::test_x[a;b]"
    assert slug_of(c) == slug_of(d)  # ... these two do not
    ids = [x.id for x in cells_for([t(c), t(d)], SESSION, platform=CPU)]
    assert len(set(ids)) == 2
    assert ids == [x.id for x in cells_for([t(c), t(d)], SESSION, platform=CPU)]


def test_the_digest_covers_the_test_its_sources_its_session_and_its_platform() -> None:
    base = cells_for([t("tests/test_a.py::x", digest="aa" * 32)], SESSION, platform=CPU)[0]
    for changed in (cells_for([t("tests/test_a.py::x", digest="bb" * 32)], SESSION,
                              platform=CPU)[0],
                    cells_for([t("tests/test_a.py::x", digest="aa" * 32)],
                              replace(SESSION, args=("tests", "-p", "x")), platform=CPU)[0],
                    cells_for([t("tests/test_a.py::x", digest="aa" * 32)], SESSION,
                              platform=replace(CPU, env=(("FLAG", "1"),)))[0]):
        assert changed.id == base.id and changed.digest != base.digest


def test_sources_a_test_depends_on(tmp_path: Path) -> None:
    root = tmp_path
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "tests" / "helpers").mkdir(parents=True)
    (root / "tests" / "conftest.py").write_text("X = 1\n")
    (root / "tests" / "helpers" / "__init__.py").write_text("")
    (root / "tests" / "helpers" / "util.py").write_text("def f(): return 1\n")
    (root / "tests" / "test_a.py").write_text("from helpers.util import f\nimport torch\n")
    (root / "tests" / "unrelated.py").write_text("Y = 2\n")
    test = str(root / "tests" / "test_a.py")

    def digest() -> str:
        return SourceDigests(str(root)).digest(test)

    first = digest()
    (root / "tests" / "unrelated.py").write_text("Y = 3\n")
    assert digest() == first  # a file the test does not import
    for path, text in (("tests/helpers/util.py", "def f(): return 2\n"),
                       ("tests/conftest.py", "X = 2\n"), ("pytest.ini", "[pytest]\nx=1\n"),
                       ("tests/test_a.py", "from helpers.util import f\n")):
        before = digest()
        (root / path).write_text(text)
        assert digest() != before, path


def test_the_ranks_see_the_users_environment_but_not_the_worlds_own() -> None:
    env = {"HOME": "/root", "MY_FLAG": "1", "RANK": "3", "TORCHELASTIC_RUN_ID": "x",
           "PYTHONPATH": "/p", "CPMATRIX_WORLD": "r/w", "NCCL_DEBUG": "INFO"}
    assert platform_for("cpu", env).env == (("MY_FLAG", "1"), ("NCCL_DEBUG", "INFO"))
    assert platform_for("cuda", env).backend == "nccl"


# ------------------------------------------------------------------- the matrix key

HEAD = "version: 1\nplatforms: {cpu: {backend: gloo, device: cpu}}\ntargets:\n"


def load(tmp_path: Path, body: str) -> Matrix:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_a.py").write_text("def test_a(): pass\n")
    return parse_matrix(HEAD + body, str(tmp_path / "m.yaml"))


def test_a_pytest_target_loads_with_its_paths_absolute(tmp_path: Path) -> None:
    m = load(tmp_path, "  - {name: suite, pytest: [tests, 'tests/test_a.py::test_a'], "
                       "timeout: 60, tags: [x]}\n")
    target = m.targets[0]
    assert (target.kind, target.case, target.level, target.timeout_s) == (
        "pytest", CASE, "unit", 60)
    assert target.pytest == (str(tmp_path / "tests"), f"{tmp_path / 'tests/test_a.py'}::test_a")


@pytest.mark.parametrize(("body", "where", "fragment"), [
    ("  - {name: s, pytest: tests/nope.py}\n", "targets[0].pytest", "no such file or folder"),
    ("  - {name: s, pytest: []}\n", "targets[0].pytest", "empty list"),
    ("  - {name: s, pytest: 'tests/test_a.py::'}\n", "targets[0].pytest", "nothing after '::'"),
    ("  - {name: s, pytest: [tests, tests]}\n", "targets[0].pytest[1]", "duplicate 'tests'"),
    ("  - {name: s, pytest: [3]}\n", "targets[0].pytest[0]", "expected a path or node id"),
    ("  - {name: s, pytest: tests, case: 'a:b'}\n", "targets[0].case",
     "a pytest target takes no 'case'"),
    ("  - {name: s, pytest: tests, axes: {mesh: [2x2]}}\n", "targets[0].axes",
     "a pytest target takes no 'axes'"),
    ("  - {name: s, pytest: tests, kind: parity}\n", "targets[0].kind", "of kind pytest"),
    ("  - {name: s, case: 'a:b', level: unit, kind: pytest}\n", "targets[0].kind",
     "names its tests with 'pytest:'"),
])
def test_bad_pytest_targets(tmp_path: Path, body: str, where: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        load(tmp_path, body)
    assert info.value.yaml_path == where and info.value.line == 4
    assert fragment in str(info.value)


def test_expand_hands_pytest_targets_to_the_collector(tmp_path: Path) -> None:
    m = load(tmp_path, "  - {name: suite, pytest: tests}\n")
    seen: list[tuple[Target, int]] = []

    def collect(matrix: Matrix, target: Target, index: int) -> list[Cell]:
        seen.append((target, index))
        return cells_for([t("tests/test_a.py::test_a")], SESSION, platform=CPU,
                         target=target.name)

    cells = expand(m, source_of=lambda module: b"", collect=collect).cells
    assert [c.target for c in cells] == ["suite"] and seen == [(m.targets[0], 0)]


def test_a_pytest_target_without_a_collector_is_refused_not_left_out(tmp_path: Path) -> None:
    """The spec runs no pytest: the collector is handed down by whoever expands. One who
    hands none gets an error naming the target, never an expansion without its tests (a
    gate would then require none of them)."""
    m = load(tmp_path, "  - {name: suite, pytest: tests}\n")
    with pytest.raises(ValueError, match=r"targets\[0\] \('suite'\) is a pytest target"):
        expand(m, source_of=lambda module: b"")
