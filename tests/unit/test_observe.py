"""What a rank's observer records for a cell (``cpmatrix.worker.observe``), in this process:
files read however they were read, modules loaded before the cell, folders imports search,
and what it leaves out (the standard library, RECORD files, the run's own folder, the
cell's own output). ``tests/worlds/test_observed_cache.py`` drives it in real worlds."""

from __future__ import annotations

import doctest
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpmatrix.worker import observe
from cpmatrix.worker.classify import record_files as _record_files
from cpmatrix.worker.observe import ABSENT, CHANGED, ReadObserver, importable
from observed_cells import cell


def test_doctests_run() -> None:
    result = doctest.testmod(observe)
    assert result.failed == 0 and result.attempted >= 6


@pytest.fixture
def obs(tmp_path: Path) -> Iterator[ReadObserver]:
    observer = ReadObserver(skip=(str(tmp_path / "out"),))
    yield observer
    observer.active = False


def test_a_data_file_read_is_recorded_with_its_signature(obs: ReadObserver,
                                                         tmp_path: Path) -> None:
    data = tmp_path / "values.txt"
    data.write_text("1.0")
    reads = cell(obs, lambda: data.read_text())
    assert reads[str(data)] == observe.signature(str(data))
    assert reads[str(data)].startswith("f:")


def test_every_way_of_opening_counts(obs: ReadObserver, tmp_path: Path) -> None:
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_text("x")

    def body() -> None:
        os.close(os.open(files[0], os.O_RDONLY))
        with open(os.fsencode(files[1]), "rb"):  # a bytes path
            pass
        os.chdir(tmp_path)
        try:
            open("f2").close()  # a relative path, from the cell's folder
        finally:
            os.chdir("/")

    reads = cell(obs, body)
    assert all(str(f) in reads for f in files), sorted(reads)


def test_a_missing_file_is_recorded_absent(obs: ReadObserver, tmp_path: Path) -> None:
    def body() -> None:
        with pytest.raises(FileNotFoundError), open(tmp_path / "config.yaml"):
            pass

    assert cell(obs, body)[str(tmp_path / "config.yaml")] == ABSENT


def test_the_cells_own_output_and_the_run_folder_are_not_inputs(obs: ReadObserver,
                                                                tmp_path: Path) -> None:
    own, out = tmp_path / "own.txt", tmp_path / "out" / "x.txt"
    out.parent.mkdir()
    out.write_text("1")
    appended = tmp_path / "log.txt"
    appended.write_text("old\n")

    def body() -> None:
        own.write_text("mine")  # created by the cell, then read back
        own.read_text()
        out.read_text()  # --out: the cells' own folder
        with open(appended, "a") as f:  # appending reads nothing
            f.write("new\n")

    reads = cell(obs, body)
    assert str(own) not in reads and str(out) not in reads and str(appended) not in reads


def test_a_file_read_then_rewritten_stays_an_input(obs: ReadObserver, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.txt"
    cfg.write_text("a")
    before = observe.signature(str(cfg))

    def body() -> None:
        cfg.read_text()
        cfg.write_text("bb")

    reads = cell(obs, body)
    assert reads[str(cfg)] == before != observe.signature(str(cfg))


def test_listed_folders_count_every_name(obs: ReadObserver, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    reads = cell(obs, lambda: (os.listdir(tmp_path / "data"), list(os.scandir(tmp_path))))
    assert reads[str(tmp_path / "data")].startswith("d:")
    assert reads[str(tmp_path)].startswith("d:")


def test_modules_loaded_any_way_are_recorded_by_their_source(obs: ReadObserver,
                                                             tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "on_path_mod_t1.py").write_text("VALUE = 1\n")
    loose = tmp_path / "loose_t1.py"
    loose.write_text("VALUE = 2\n")
    for _ in range(2):  # the second time from byte code: still the source counts
        sys.modules.pop("on_path_mod_t1", None)

        def body() -> None:
            sys.path.insert(0, str(lib))
            try:
                __import__("on_path_mod_t1")
            finally:
                sys.path.remove(str(lib))
            spec = importlib.util.spec_from_file_location("loose_t1", loose)
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(importlib.util.module_from_spec(spec))

        reads = cell(obs, body)
        assert reads[str(lib / "on_path_mod_t1.py")].startswith("f:")
        assert reads[str(loose)].startswith("f:")
        assert not any(p.endswith(".pyc") for p in reads), sorted(reads)
    sys.modules.pop("on_path_mod_t1", None)


def test_the_standard_library_and_distributions_are_not_observed(obs: ReadObserver) -> None:
    def body() -> None:
        import json.tool  # noqa: F401  (stdlib)

        import pytest as p  # an installed distribution, in its RECORD

        open(p.__file__).close()

    reads = cell(obs, body)
    assert not any("/json/" in r for r in reads)
    assert pytest.__file__ not in reads


def test_a_module_loaded_before_the_cell_is_in_its_set(obs: ReadObserver,
                                                      tmp_path: Path) -> None:
    (tmp_path / "early_t2.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        __import__("early_t2")  # the world's own import, or an earlier cell's
        reads = cell(obs, lambda: None)
        assert reads[str(tmp_path / "early_t2.py")].startswith("f:")
        assert reads[str(tmp_path)].startswith("p:")  # a folder imports search
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("early_t2", None)


def test_what_an_earlier_cell_read_stays_but_a_dropped_module_goes(obs: ReadObserver,
                                                                   tmp_path: Path) -> None:
    data = tmp_path / "table.csv"
    data.write_text("1,2")
    (tmp_path / "dropped_t3.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        first = cell(obs, lambda: (data.read_text(), __import__("dropped_t3")))
        assert str(data) in first and str(tmp_path / "dropped_t3.py") in first
        del sys.modules["dropped_t3"]  # as isolation drops a project module
        later = cell(obs, lambda: None)
    finally:
        sys.path.remove(str(tmp_path))
    # a module-level cache of the table may still hold it: it stays in the key
    assert later[str(data)] == first[str(data)]
    assert str(tmp_path / "dropped_t3.py") not in later


def test_a_file_that_changed_since_an_earlier_read_is_changed(obs: ReadObserver,
                                                             tmp_path: Path) -> None:
    data = tmp_path / "table.csv"
    data.write_text("1,2")
    cell(obs, data.read_text)
    data.write_text("1,2,3")
    assert cell(obs, data.read_text)[str(data)] == CHANGED


def test_nothing_is_recorded_between_cells(obs: ReadObserver, tmp_path: Path) -> None:
    data = tmp_path / "between.txt"
    data.write_text("x")
    cell(obs, lambda: None)
    data.read_text()  # not in a cell
    assert str(data) not in cell(obs, lambda: None)


def test_record_files_lists_non_editable_distributions_only(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "good-1.0.dist-info").mkdir(parents=True)
    (site / "good-1.0.dist-info" / "RECORD").write_text(
        "good/__init__.py,sha256=x,1\ngood/sub.py,,\n../../bin/good,,\n"
        '"good/a,b.py",sha256=y,2\n')
    (site / "mine-1.0.dist-info").mkdir()
    (site / "mine-1.0.dist-info" / "RECORD").write_text("__editable__.mine.pth,,\n")
    (site / "mine-1.0.dist-info" / "direct_url.json").write_text(
        '{"url": "file:///src", "dir_info": {"editable": true}}')
    files = _record_files([str(site), str(tmp_path / "nowhere")])
    assert files == {str(site / "good" / "__init__.py"), str(site / "good" / "sub.py"),
                     str(site / "good" / "a,b.py")}


@pytest.mark.parametrize(("name", "ok"), [
    ("mod.py", True), ("pkg", True), ("m.cpython-311-x86_64-linux-gnu.so", True),
    ("x.pth", True), ("mod.pyc", True), ("data.csv", False), ("__pycache__", False),
    (".git", False), ("my-dist-1.0.dist-info", False), ("README", True),
])
def test_importable_names(name: str, ok: bool) -> None:
    assert importable(name) is ok


def test_a_failing_observer_never_fails_the_case_and_leaves_it_unobserved(
        obs: ReadObserver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "values.txt"
    data.write_text("1.0")

    def broken(path: object) -> str:
        raise RuntimeError("observer bug")

    monkeypatch.setattr(observe, "_absolute", broken)
    obs.start()
    assert data.read_text() == "1.0"  # the case's own open is untouched
    assert obs.stop() is None  # ... and its pass will not be cached
    monkeypatch.undo()
    assert cell(obs, data.read_text) is not None  # the next cell is observed again


def test_a_failing_scan_leaves_the_cell_unobserved(obs: ReadObserver,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> object:
        raise RuntimeError("odd module")

    monkeypatch.setattr(observe, "_scan", broken)
    obs.start()
    assert obs.stop() is None


def test_an_editable_distribution_is_told_by_its_direct_url(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    for name, url in (("a-1.0", '{"dir_info": {"editable": false}}'), ("b-1.0", "not json")):
        (site / f"{name}.dist-info").mkdir(parents=True)
        (site / f"{name}.dist-info" / "RECORD").write_text(f"{name[0]}/x.py,,\n")
        (site / f"{name}.dist-info" / "direct_url.json").write_text(url)
    assert _record_files([str(site)]) == {str(site / "a" / "x.py"), str(site / "b" / "x.py")}
