"""What a cached PASS is keyed on (``cpmatrix.run.cache``), without running a cell: the imports
a case module's closure follows (relative ones included), the action digest's inputs, and
the stored entry. ``test_cache.py`` drives the cache through the real CLI."""

from __future__ import annotations

import doctest
import inspect
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cpmatrix.paths import PACKAGE_DIR
from cpmatrix.result import Result, Status
from cpmatrix.run import cache
from cpmatrix.run.cache import ActionKeys, ResultCache, _imports, default_cache_dir


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
                _digest(keys, mutant="m")]
    assert len({base, *variants}) == 6
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
        store.put("ab" * 32, Result(cell_id="c", status=Status.PASSED, evidence={"x": 1}))
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
    store.put("cd" * 32, Result(cell_id="c", status=Status.PASSED))
    path = tmp_path / "results" / "cd" / f"{'cd' * 32}.json"
    path.write_text(re.sub(r'"stored_at": "[^"]+",', "", path.read_text()))
    hit = store.get("cd" * 32, "c")
    assert hit is not None and hit.message == "(cached) passed at ?"


def test_mutant_runs_and_failures_are_never_stored(tmp_path: Path) -> None:
    store = ResultCache(tmp_path)
    store.put("ef" * 32, Result(cell_id="c", status=Status.PASSED, mutant="m"))
    store.put("ef" * 32, Result(cell_id="c", status=Status.FAILED, mutant="m"))
    assert store.get("ef" * 32, "c") is None
    assert not (tmp_path / "results").exists()


def test_the_runtime_digest_covers_the_worker_side_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing the worker (or any module that runs inside the worlds) invalidates every
    cached pass, wherever cpmatrix is installed: it is read from the package itself."""
    import shutil

    import cpmatrix.run.cache as cache_mod

    pkg = tmp_path / "cpmatrix"
    shutil.copytree(PACKAGE_DIR, pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_mod, "_PACKAGE_DIR", pkg)
    before = ActionKeys(search_path=()).runtime_digest
    for name in cache_mod._RUNTIME_MODULES:
        path = pkg.joinpath(*name.split(".")[1:]).with_suffix(".py")
        original = path.read_bytes()
        path.write_bytes(original + b"\n# edited\n")
        assert ActionKeys(search_path=()).runtime_digest != before, name
        path.write_bytes(original)
    assert ActionKeys(search_path=()).runtime_digest == before


def test_bundled_cases_cover_the_toolkit_they_import_but_never_site_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import cpmatrix.run.cache as cache_mod

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
