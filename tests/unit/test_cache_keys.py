"""What a cached PASS is keyed on (``cpmatrix.cache.key``), without running a cell: the imports
a case module's closure follows (relative ones included), the action digest's inputs, and
the stored entry. ``test_cache.py`` drives the cache through the real CLI."""

from __future__ import annotations

import doctest
import hashlib
import inspect
import json
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cpmatrix.cache import key as cache
from cpmatrix.cache.key import (
    FORMAT,
    ActionKeys,
    ReadHashes,
    ResultCache,
    _imports,
    default_cache_dir,
    merge_reads,
)
from cpmatrix.paths import PACKAGE_DIR
from cpmatrix.result import Result, Status
from cpmatrix.worker.observe import ABSENT, CHANGED, signature


def test_doctests_run() -> None:
    result = doctest.testmod(cache)
    assert result.failed == 0 and result.attempted >= 5


# --------------------------------------------------------------------------------------
# which modules a source imports


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import a.b, c", "m", False, ["a.b", "c"]),
        ("from a.b import c, d", "m", False, ["a.b", "a.b.c", "a.b.d"]),
        ("from a import *", "m", False, ["a"]),
        ("from a import b", "pkg.case", False, ["a", "a.b"]),  # absolute inside a package
        # relative, from a module: the dots count from its package
        ("from .helper import f", "pkg.case", False, ["pkg.helper", "pkg.helper.f"]),
        ("from . import helper", "pkg.case", False, ["pkg", "pkg.helper"]),
        ("from .. import helper", "pkg.sub.case", False, ["pkg", "pkg.helper"]),
        ("from ..util.io import read", "pkg.sub.case", False,
         ["pkg.util.io", "pkg.util.io.read"]),
        ("from ...top import x", "a.b.c.d", False, ["a.top", "a.top.x"]),
        ("from .x import *", "pkg.case", False, ["pkg.x"]),
        # relative, from a package's __init__: the package itself is the anchor
        ("from .inner import g", "pkg.sub", True, ["pkg.sub.inner", "pkg.sub.inner.g"]),
        ("from .. import helper", "pkg.sub", True, ["pkg", "pkg.helper"]),
        # dots above the top-level package (an ImportError in Python): nothing
        ("from .. import helper", "pkg.case", False, []),
        ("from .... import x", "a.b.c", True, []),
        ("from . import helper", "toplevel", False, []),
        ("from .helper import f", "toplevel", False, []),
        ("def broken(:", "m", False, []),
    ],
)
def test_imports_resolve_like_python(source: str, module: str, is_package: bool,
                                     expected: list[str]) -> None:
    assert _imports(source.encode(), module, is_package) == expected


def test_imports_inside_functions_and_branches_count_too() -> None:
    source = b"def f():\n    import lazy\nif False:\n    from .rare import r\n"
    assert _imports(source, "pkg.case", False) == ["lazy", "pkg.rare", "pkg.rare.r"]


# --------------------------------------------------------------------------------------
# the closure of a case module


FILES = {
    "pkg/__init__.py": "",
    "pkg/case.py": "import torch\nfrom .helper import f\nfrom . import sibling\n"
                   "from .sub import g\n",
    "pkg/helper.py": "SCALE = 2.0\n",
    "pkg/sibling.py": "X = 1\n",
    "pkg/sub/__init__.py": "from .inner import g\n",
    "pkg/sub/inner.py": "from ..deep import h\ndef g(): return h()\n",
    "pkg/deep.py": "def h(): return 1\n",
    "pkg/unused.py": "Y = 0\n",
    "other.py": "Z = 0\n",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        path = tmp_path / "cases" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "cases"


def closure(root: Path, module: str = "pkg.case") -> str:
    return ActionKeys(search_path=(str(root),)).module_closure_digest(module)


@pytest.mark.parametrize(
    "edited",
    ["pkg/case.py", "pkg/helper.py", "pkg/sibling.py", "pkg/__init__.py", "pkg/sub/__init__.py",
     "pkg/sub/inner.py", "pkg/deep.py"],
)
def test_editing_any_module_the_case_reaches_changes_its_key(project: Path, edited: str) -> None:
    # every one is reached through a relative import (or a parent package): a stale key
    # here would serve a cached PASS for code that changed
    before = closure(project)
    assert closure(project) == before  # deterministic
    (project / edited).write_text((project / edited).read_text() + "\n# edited\n")
    assert closure(project) != before


@pytest.mark.parametrize(
    ("module", "edited"),
    [("pkg.deep", "pkg/__init__.py"), ("pkg.sub.inner", "pkg/sub/__init__.py"),
     ("pkg.sub.inner", "pkg/__init__.py")],
)
def test_a_submodule_key_covers_its_parent_packages(project: Path, module: str,
                                                    edited: str) -> None:
    # importing pkg.sub.inner runs pkg/__init__.py and pkg/sub/__init__.py first, though
    # inner.py never names them
    before = closure(project, module)
    (project / edited).write_text((project / edited).read_text() + "\n# edited\n")
    assert closure(project, module) != before


@pytest.mark.parametrize("edited", ["pkg/unused.py", "other.py"])
def test_editing_a_module_the_case_never_imports_keeps_its_key(project: Path,
                                                               edited: str) -> None:
    before = closure(project)
    (project / edited).write_text("CHANGED = True\n")
    assert closure(project) == before


def test_the_closure_is_keyed_on_module_names_too(project: Path) -> None:
    # the same source under another module name is another closure
    (project / "pkg" / "sibling.py").write_text(FILES["pkg/helper.py"])
    assert closure(project, "pkg.helper") != closure(project, "pkg.sibling")


def test_an_unknown_module_has_a_key_and_reads_nothing(project: Path) -> None:
    keys = ActionKeys(search_path=(str(project),))
    empty = keys.module_closure_digest("no.such.module")
    assert re.fullmatch(r"[0-9a-f]{64}", empty)
    assert empty != keys.module_closure_digest("pkg.case")


def test_a_closure_is_walked_once_per_run(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ActionKeys(search_path=(str(project),))
    first = keys.module_closure_digest("pkg.case")

    def walked(module: str) -> Any:
        raise AssertionError(f"{module} read again: the closure must be memoized")

    monkeypatch.setattr(keys, "_local", walked)
    assert keys.module_closure_digest("pkg.case") == first


# --------------------------------------------------------------------------------------
# the action digest


def _digest(keys: ActionKeys, case: str = "pkg.case:run", cell: str = "cell-1",
            runner: str = "local", env: str = "1", **extra: Any) -> str:
    # The runtime's key fields grow (a toolchain= keyword is on its way): the inputs under
    # test here are passed by name, any further required keyword gets an empty mapping.
    params = inspect.signature(keys.digest).parameters
    extra.update({name: {} for name, p in params.items()
                  if p.kind is p.KEYWORD_ONLY and p.default is p.empty
                  and name not in ("runner_identity", "env")})
    fake: Any = SimpleNamespace(digest=cell, case=case)
    return keys.digest(fake, runner_identity={"runner": runner}, env={"A": env}, **extra)


def test_the_action_digest_changes_with_each_input(project: Path) -> None:
    keys = ActionKeys(search_path=(str(project),))
    assert re.fullmatch(r"[0-9a-f]{64}", keys.runtime_digest)
    base = _digest(keys)
    assert base == _digest(keys, mutant="")  # a plain run is the run of no mutant
    variants = [_digest(keys, cell="cell-2"), _digest(keys, case="other:run"),
                _digest(keys, runner="docker"), _digest(keys, env="2"),
                _digest(keys, mutant="m"), _digest(keys, machine={"cpu_flags": "avx2"}),
                _digest(keys, machine={"cpu_flags": "avx2,avx512f"})]
    assert len({base, *variants}) == 8
    assert base == _digest(keys, machine={}) == _digest(keys, machine=None)
    keys.runtime_digest = "0" * 64  # another cpmatrix version
    assert _digest(keys) != base


def test_the_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "cpmatrix"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "cpmatrix"


# --------------------------------------------------------------------------------------
# the stored entry


def test_a_hit_is_the_stored_pass_marked_cached_with_when(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # stored_at is UTC even where local time is not
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        store = ResultCache(tmp_path)
        store.put("ab" * 32, Result(cell_id="c", status=Status.PASSED, evidence={"x": 1}), {})
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    entry = (tmp_path / "results" / "ab" / f"{'ab' * 32}.json").read_text(encoding="utf-8")
    stamp = re.search(r'"stored_at": "([^"]+)"', entry)
    assert stamp is not None
    when = datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - when).total_seconds()) < 600
    hit = store.get("ab" * 32, "c")
    assert hit is not None and hit.status is Status.CACHED and hit.evidence == {"x": 1}
    assert hit.message == f"(cached) passed at {stamp.group(1)}"


def test_an_entry_without_a_date_still_hits(tmp_path: Path) -> None:
    store = ResultCache(tmp_path)
    store.put("cd" * 32, Result(cell_id="c", status=Status.PASSED), {})
    path = tmp_path / "results" / "cd" / f"{'cd' * 32}.json"
    path.write_text(re.sub(r'"stored_at": "[^"]+",', "", path.read_text()))
    hit = store.get("cd" * 32, "c")
    assert hit is not None and hit.message == "(cached) passed at ?"


def test_mutant_runs_and_failures_are_never_stored(tmp_path: Path) -> None:
    store = ResultCache(tmp_path)
    store.put("ef" * 32, Result(cell_id="c", status=Status.PASSED, mutant="m"), {})
    store.put("ef" * 32, Result(cell_id="c", status=Status.FAILED, mutant="m"), {})
    assert store.get("ef" * 32, "c") is None
    assert not (tmp_path / "results").exists()


#: cpmatrix modules that run in a world but were missing from the hand-written list the
#: runtime digest once read (issue 21, row 5): an edit of any of them reused old passes.
WORLD_SIDE = {"cpmatrix.worker.world_main", "cpmatrix.worker.subworld",
              "cpmatrix.worker.protocol", "cpmatrix.worker.forkrun",
              "cpmatrix.worker.isolation", "cpmatrix.worker.observe", "cpmatrix.worker.procs",
              "cpmatrix.worker.watchdog", "cpmatrix.worker.compile_main", "cpmatrix.cell",
              "cpmatrix.fsutil"}


def test_the_runtime_digest_covers_every_module_that_runs_in_a_world(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 5: editing any cpmatrix module a world runs (the closure of the world-side
    entry points: ranks, the fork launcher, the container watchdog, the spill compiler)
    invalidates every cached pass, wherever cpmatrix is installed: it is read from the
    package itself."""
    import shutil

    import cpmatrix.cache.key as cache_mod

    pkg = tmp_path / "cpmatrix"
    shutil.copytree(PACKAGE_DIR, pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_mod, "_PACKAGE_DIR", pkg)
    keys = ActionKeys(search_path=())
    files = {name: Path(path) for entry in cache_mod.WORKER_ENTRIES
             for name, path in keys.closure_sources(entry).items()}
    assert set(files) >= WORLD_SIDE, WORLD_SIDE - set(files)
    assert all(str(p).startswith(str(pkg)) for p in files.values()), "read from the package"
    before = keys.runtime_digest
    for name, path in sorted(files.items()):
        original = path.read_bytes()
        path.write_bytes(original + b"\n# edited\n")
        assert ActionKeys(search_path=()).runtime_digest != before, name
        path.write_bytes(original)
    assert ActionKeys(search_path=()).runtime_digest == before
    # A module no world runs (the command line) is not in it.
    cli = pkg / "cli" / "list.py"
    cli.write_text(cli.read_text() + "\n# edited\n")
    assert ActionKeys(search_path=()).runtime_digest == before


def test_bundled_cases_cover_the_toolkit_they_import_but_never_site_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import cpmatrix.cache.key as cache_mod

    pkg = tmp_path / "site" / "cpmatrix"
    shutil.copytree(PACKAGE_DIR, pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    # A third-party package beside cpmatrix (as in a wheel install's site-packages).
    (tmp_path / "site" / "torch").mkdir()
    (tmp_path / "site" / "torch" / "__init__.py").write_text("X = 1\n")
    monkeypatch.setattr(cache_mod, "_PACKAGE_DIR", pkg)
    keys = ActionKeys(search_path=())
    before = keys.module_closure_digest("cpmatrix.suite.cases.unit")
    # A package beside cpmatrix is not the project's: editing it changes nothing.
    (tmp_path / "site" / "torch" / "__init__.py").write_text("X = 2\n")
    assert ActionKeys(search_path=()).module_closure_digest("cpmatrix.suite.cases.unit") \
        == before
    # The toolkit the bundled cases import is: editing it changes their key.
    compare = pkg / "parity" / "compare.py"
    compare.write_text(compare.read_text() + "\n# edited\n")
    assert ActionKeys(search_path=()).module_closure_digest("cpmatrix.suite.cases.unit") \
        != before


# --------------------------------------------------------------------------------------
# the source digest: what merge and gate compare


def test_the_source_digest_covers_the_cell_its_imports_and_the_runtime(project: Path) -> None:
    keys = ActionKeys(search_path=(str(project),))
    fake: Any = SimpleNamespace(digest="cell-1", case="pkg.case:run")
    base = keys.source_digest(fake)
    assert re.fullmatch(r"[0-9a-f]{64}", base) and keys.source_digest(fake) == base
    assert keys.source_digest(SimpleNamespace(digest="cell-2", case="pkg.case:run")) != base
    (project / "pkg" / "deep.py").write_text("def h(): return 2\n")  # reached by an import
    assert ActionKeys(search_path=(str(project),)).source_digest(fake) != base
    keys.runtime_digest = "0" * 64
    assert keys.source_digest(fake) != base
    # The pre-key is built on it: where and how it runs do not change the source.
    assert _digest(keys, runner="docker") != _digest(keys)


# --------------------------------------------------------------------------------------
# the observed set: merged over ranks, hashed with its signatures checked, re-hashed


def test_merging_ranks_marks_a_path_seen_two_ways_changed() -> None:
    assert merge_reads([]) == {}
    assert merge_reads([{"a": "f:1"}, {"a": "f:1", "b": "-"}]) == {"a": "f:1", "b": "-"}
    assert merge_reads([{"a": "f:1"}, {"a": "f:2"}, {"a": "f:1"}]) == {"a": CHANGED}
    assert merge_reads([{"a": "f:1"}, None]) is None
    assert merge_reads([None, {"a": "f:1"}]) is None


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "data.txt").write_text("1.0")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mod.py").write_text("X = 1\n")
    (tmp_path / "lib" / "notes.txt").write_text("n")
    return tmp_path


def test_settle_hashes_what_the_ranks_saw(tree: Path) -> None:
    data, lib = str(tree / "data.txt"), str(tree / "lib")
    reads = {data: signature(data), lib: "p" + signature(lib)[1:],
             str(tree / "lib2"): ABSENT, str(tree): "d" + signature(str(tree))[1:]}
    hashes = ReadHashes()
    settled = hashes.settle(reads)
    assert isinstance(settled, dict)
    assert settled[data] == "sha256:" + hashlib.sha256(b"1.0").hexdigest()
    assert settled[lib] == "py:" + hashlib.sha256(b"mod.py").hexdigest()  # importable only
    assert settled[str(tree)] == "ls:" + hashlib.sha256(b"data.txt\nlib").hexdigest()
    assert settled[str(tree / "lib2")] == "absent"
    assert list(settled) == sorted(settled)
    for path, digest in settled.items():
        assert hashes.matches(path, digest), path


@pytest.mark.parametrize(("change", "why"), [
    ("edit", "changed after the cell read it"),
    ("delete", "changed after the cell read it"),
    ("create", "changed after the cell read it"),
    ("folder-for-file", "changed after the cell read it"),
    ("changed-on-a-rank", "changed while the cell ran"),
    ("unknown-kind", "unknown signature"),
])
def test_settle_refuses_a_path_that_changed_after_a_rank_read_it(tree: Path, change: str,
                                                                 why: str) -> None:
    data = str(tree / "data.txt")
    reads = {data: signature(data)}
    if change == "edit":
        (tree / "data.txt").write_text("2.0")
    elif change == "delete":
        os.unlink(data)
    elif change == "create":
        reads = {str(tree / "new.txt"): ABSENT}
        (tree / "new.txt").write_text("x")
    elif change == "changed-on-a-rank":
        reads = {data: CHANGED}
    elif change == "folder-for-file":
        reads = {str(tree / "lib"): "f" + signature(str(tree / "lib"))[1:]}
    else:
        reads = {data: "z" + signature(data)[1:]}
    path, sig = next(iter(reads.items()))
    expected = f"{path}: unknown signature {sig!r}" if why == "unknown signature" \
        else f"{path} {why}"
    assert ReadHashes().settle(reads) == expected


def test_settle_refuses_a_file_edited_while_it_was_hashed(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = str(tree / "data.txt")
    real = signature(data)
    seen = iter([real, real, real, "f:9:9:9:9"])  # settle, digest, digest, settle again
    monkeypatch.setattr(cache, "signature", lambda path: next(seen))
    assert ReadHashes().settle({data: real}) == f"{data} changed while it was hashed"


def test_settle_checks_every_path_not_only_the_first(tree: Path) -> None:
    data, later = str(tree / "data.txt"), str(tree / "zz.txt")
    (tree / "zz.txt").write_text("z")
    reads = {data: signature(data), later: signature(later)}
    (tree / "zz.txt").write_text("zz")
    assert ReadHashes().settle(reads) == f"{later} changed after the cell read it"


def test_settle_skips_a_containers_own_files_only_for_such_a_runner(tree: Path) -> None:
    gone = str(tree / "image-only.py")
    reads = {gone: "f:10:1:1:1"}  # seen by the ranks, not on this machine
    assert isinstance(ReadHashes().settle(reads), str)
    assert ReadHashes().settle(reads, private_files=True) == {}
    # ... and the paths after it are still hashed (and checked)
    data = str(tree / "zz.txt")
    (tree / "zz.txt").write_text("z")
    settled = ReadHashes().settle({gone: "f:10:1:1:1", data: signature(data)},
                                  private_files=True)
    assert settled == {data: "sha256:" + hashlib.sha256(b"z").hexdigest()}
    # a path the ranks found absent is no container file: it must still be absent
    assert ReadHashes().settle({data: ABSENT}, private_files=True) == \
        f"{data} changed after the cell read it"


def test_matches_rehashes_what_changed_and_nothing_else(tree: Path) -> None:
    data = str(tree / "data.txt")
    hashes = ReadHashes()
    stored = hashes.digest(data, "f")
    assert hashes.hashed == 1
    assert hashes.matches(data, stored) and hashes.hashed == 1  # remembered
    (tree / "data.txt").write_text("2.5")  # another size: another signature
    assert not hashes.matches(data, stored) and hashes.hashed == 2
    assert not hashes.matches(data, "absent")
    assert hashes.matches(str(tree / "nope"), "absent")
    assert not hashes.matches(str(tree / "nope"), stored)
    assert not hashes.matches(data, "md5:abc")  # an unknown kind is never a hit
    assert hashes.digest(str(tree / "lib"), "f") == "absent"  # a folder is no file
    assert hashes.digest(data, "d") == "absent"  # a file is no folder
    assert ReadHashes().matches(str(tree / "lib"), ReadHashes().digest(str(tree / "lib"), "d"))


def test_a_file_hashed_again_only_when_its_signature_moved(tree: Path) -> None:
    data = str(tree / "data.txt")
    hashes = ReadHashes()
    first = hashes.digest(data, "f")
    os.utime(data, ns=(1, 1))  # same bytes, new signature: hashed again, same hash
    assert hashes.digest(data, "f") == first and hashes.hashed == 2


def test_unreadable_is_never_a_hit(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashes = ReadHashes()
    stored = hashes.digest(str(tree / "lib"), "d")

    def denied(path: str) -> list[str]:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "listdir", denied)
    os.utime(tree / "lib", ns=(1, 1))  # a new signature: read again, and refused
    assert hashes.digest(str(tree / "lib"), "d") == "unreadable:PermissionError"
    assert not hashes.matches(str(tree / "lib"), stored)


# --------------------------------------------------------------------------------------
# the entry, with its observed set


def test_a_hit_needs_every_read_unchanged(tmp_path: Path, tree: Path) -> None:
    data = str(tree / "data.txt")
    cache = ResultCache(tmp_path / "cache")
    ok = Result(cell_id="c", status=Status.PASSED, evidence={"x": 1})
    settled = cache.hashes.settle({data: signature(data)})
    assert isinstance(settled, dict)
    assert cache.put("ab" * 32, ok, settled) is True
    entry = json.loads((tmp_path / "cache" / "results" / "ab" / f"{'ab' * 32}.json")
                       .read_text())
    assert entry["format"] == FORMAT == "cpmatrix-cache/3" and entry["key"] == "ab" * 32
    assert entry["reads"] == settled
    assert ResultCache(tmp_path / "cache").get("ab" * 32, "c") is not None
    (tree / "data.txt").write_text("9.9")
    assert ResultCache(tmp_path / "cache").get("ab" * 32, "c") is None


@pytest.mark.parametrize("edit", [
    {"format": "cpmatrix-cache/1"}, {"format": None}, {"key": "cd" * 32}, {"reads": []},
    {"reads": {"/x": 3}}, {"reads": None},
])
def test_entries_of_another_format_or_key_are_misses(tmp_path: Path, edit: dict[str, Any],
                                                     ) -> None:
    cache = ResultCache(tmp_path)
    cache.put("ab" * 32, Result(cell_id="c", status=Status.PASSED), {})
    path = tmp_path / "results" / "ab" / f"{'ab' * 32}.json"
    data = json.loads(path.read_text())
    data.update(edit)
    if edit.get("format") is None and "format" in edit:
        del data["format"]
    path.write_text(json.dumps(data))
    assert cache.get("ab" * 32, "c") is None


def test_an_entry_without_reads_is_a_miss(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    cache.put("ab" * 32, Result(cell_id="c", status=Status.PASSED), {})
    path = tmp_path / "results" / "ab" / f"{'ab' * 32}.json"
    data = json.loads(path.read_text())
    del data["reads"]
    path.write_text(json.dumps(data))
    assert cache.get("ab" * 32, "c") is None


@pytest.mark.parametrize("result", [
    Result(cell_id="c", status=Status.PASSED, attempts=2),  # passed on a retry
    Result(cell_id="c", status=Status.FLAKY, attempts=2),
    Result(cell_id="c", status=Status.CACHED),
    Result(cell_id="c", status=Status.PASSED, mutant="m"),
])
def test_only_a_first_attempt_plain_pass_is_stored(tmp_path: Path, result: Result) -> None:
    cache = ResultCache(tmp_path)
    assert cache.put("ab" * 32, result, {}) is False
    assert not (tmp_path / "results").exists()


def test_a_stored_entry_is_the_same_result_marked_cached(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    ok = Result(cell_id="c", status=Status.PASSED, evidence={"x": 1}, duration_s=2.5,
                source={"digest": "d"})
    cache.put("ab" * 32, ok, {})
    hit = cache.get("ab" * 32, "c")
    assert hit is not None
    assert hit.status is Status.CACHED and hit.evidence == {"x": 1} and hit.duration_s == 2.5
    assert cache.get("ab" * 32, "other") is None


@pytest.mark.parametrize("text", ["[]", '"x"', '{"result": []}', '{"result": {}, "reads": {}}',
                                  "{not json", ""])
def test_entries_that_are_not_entries_are_misses(tmp_path: Path, text: str) -> None:
    path = tmp_path / "results" / "ab" / f"{'ab' * 32}.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert ResultCache(tmp_path).get("ab" * 32, "c") is None


def test_an_entry_that_is_no_pass_is_a_miss(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    cache.put("ab" * 32, Result(cell_id="c", status=Status.PASSED), {})
    path = tmp_path / "results" / "ab" / f"{'ab' * 32}.json"
    data = json.loads(path.read_text())
    data["result"]["status"] = "failed"
    path.write_text(json.dumps(data))
    assert cache.get("ab" * 32, "c") is None


def test_the_entry_lists_its_reads_in_path_order(tmp_path: Path, tree: Path) -> None:
    cache = ResultCache(tmp_path)
    reads = {str(tree / "lib"): "py:1", str(tree / "data.txt"): "sha256:2"}
    cache.put("ab" * 32, Result(cell_id="c", status=Status.PASSED), reads)
    entry = json.loads((tmp_path / "results" / "ab" / f"{'ab' * 32}.json").read_text())
    assert list(entry["reads"]) == sorted(reads)
    assert set(entry) == {"format", "key", "stored_at", "reads", "result"}


def test_a_project_with_several_pythonpath_folders_reaches_each(tmp_path: Path) -> None:
    first, second = tmp_path / "cases", tmp_path / "lib"
    first.mkdir()
    second.mkdir()
    (first / "case.py").write_text("import helper\n")
    (second / "helper.py").write_text("X = 1\n")
    keys = ActionKeys(search_path=(str(first), str(second)))
    assert set(keys.closure_sources("case")) == {"case", "helper"}
    before = keys.module_closure_digest("case")
    (second / "helper.py").write_text("X = 2\n")
    assert ActionKeys(search_path=(str(first), str(second))).module_closure_digest(
        "case") != before


def test_a_source_digest_is_computed_once_per_cell(project: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ActionKeys(search_path=(str(project),))
    fake: Any = SimpleNamespace(digest="cell-1", case="pkg.case:run")
    first = keys.source_digest(fake)

    def walked(module: str) -> str:
        raise AssertionError(f"{module}: the source digest must be memoized")

    monkeypatch.setattr(keys, "module_closure_digest", walked)
    assert keys.source_digest(fake) == first


def test_a_cache_uses_the_hashes_it_is_given(tmp_path: Path) -> None:
    hashes = ReadHashes()
    assert ResultCache(tmp_path, hashes).hashes is hashes
    assert isinstance(ResultCache(tmp_path).hashes, ReadHashes)


def test_settle_checks_the_paths_after_an_absent_one(tree: Path) -> None:
    data = str(tree / "data.txt")
    reads = {str(tree / "a-missing.txt"): ABSENT, data: signature(data)}
    (tree / "data.txt").write_text("2.0")
    assert ReadHashes().settle(reads) == f"{data} changed after the cell read it"


def test_an_unobservable_start_is_never_stored_and_its_reason_comes_first(
        tmp_path: Path) -> None:
    """Issue 30, row 1: a process the cell started that was not followed (``?`` + why)
    outranks every other reason, wherever it sorts, and nothing is hashed for it."""
    data = tmp_path / "data.txt"
    data.write_text("1")
    hashes = ReadHashes()
    why = "it started `cat data.txt`, which reported no reads"
    assert hashes.settle({str(data): signature(str(data)), "start:`cat`": "?" + why}) == why
    assert hashes.settle({"/a": CHANGED, "~z": "?" + why}) == why
    assert hashes.settle({str(data): signature(str(data))}) == {
        str(data): "sha256:" + hashlib.sha256(b"1").hexdigest()}
    assert merge_reads([{"s": "?" + why}, {"s": "?other"}, {"s": "f:1"}]) == {"s": "?" + why}
