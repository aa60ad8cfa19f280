"""What the fork launcher imports for a world's test files before the ranks fork
(:mod:`cpmatrix.pytest_front.preload`): only unconditional imports of installed modules,
found at the same place by the rank, never a pytest plugin's package or the project's."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from cpmatrix.pytest_front.preload import (
    files_to_read,
    installed_imports,
    plugin_packages,
    preload,
    unconditional_imports,
)


def test_only_imports_that_run_whenever_the_module_runs() -> None:
    tree = ast.parse(
        "import a, b.c\nfrom d.e import f\nif X:\n    import g\nelse:\n    import h\n"
        "try:\n    import i\n    try:\n        import j\n    except E:\n        pass\n"
        "except ImportError:\n    import k\nfinally:\n    pass\n"
        "def l():\n    import m\nclass N:\n    import o\nwith p:\n    import q\n"
        "from . import r\nfrom .s import t\nimport a\n")
    assert unconditional_imports(tree) == ["a", "b.c", "d.e", "i", "j"]


def test_conftests_from_the_rootdir_down_come_first(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    for conf in (tmp_path / "conftest.py", tmp_path / "sub" / "deep" / "conftest.py"):
        conf.write_text("")
    test = tmp_path / "sub" / "deep" / "test_x.py"
    other = tmp_path / "test_y.py"
    assert files_to_read([str(test), str(other)], str(tmp_path)) == [
        str(tmp_path / "conftest.py"), str(tmp_path / "sub" / "deep" / "conftest.py"),
        str(test), str(other)]


def _write(folder: Path, name: str, text: str = "") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_installed_modules_only_and_found_where_the_rank_finds_them(tmp_path: Path) -> None:
    site, project = tmp_path / "site", tmp_path / "project"
    _write(site, "cpmx_inst_a/__init__.py")
    _write(site, "cpmx_inst_b/__init__.py")
    _write(site, "cpmx_plug/__init__.py")
    _write(site, "cpmx_inst_c/__init__.py")
    _write(site, "cpmx_inst_c/mod.py")
    _write(project, "cpmx_local.py")
    # Shadowed for the rank: its sys.path finds the project's copy first.
    _write(project, "cpmx_inst_b/__init__.py")
    test = _write(project, "test_t.py", "import cpmx_inst_a\nimport cpmx_inst_b.sub\n"
                  "import cpmx_local\nimport cpmx_plug\nimport cpmx_inst_c.mod\n"
                  "import cpmx_missing\n")
    sys.path[:0] = [str(site), str(project)]
    try:
        def installed(path: str) -> bool:
            return path.startswith(str(site))

        names = installed_imports([str(test)], [str(project), str(site), *sys.path[2:]],
                                  installed, {"cpmx_plug"})
    finally:
        del sys.path[:2]
    # cpmx_inst_b: the rank finds the project's; cpmx_local: the project's;
    # cpmx_plug: a plugin's; cpmx_missing: not found (the rank reports it).
    assert names == ["cpmx_inst_a", "cpmx_inst_c.mod"]


def test_a_module_that_fails_to_import_is_left_for_the_rank(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _write(site, "cpmx_boom/__init__.py", "raise SystemExit('no')\n")
    _write(site, "cpmx_fine/__init__.py", "VALUE = 1\n")
    test = _write(tmp_path, "test_t.py", "import cpmx_boom\nimport cpmx_fine\n")
    sys.path.insert(0, str(site))
    try:
        done = preload([str(test)], str(tmp_path), list(sys.path),
                       lambda p: p.startswith(str(site)))
        assert done == ["cpmx_fine"]
        assert "cpmx_boom" not in sys.modules
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("cpmx_fine", None)


def test_the_packages_of_pytest_plugins_are_known() -> None:
    # pytest's own plugins come with pytest; a pytest11 distribution installed here
    # (cpmatrix registers one) names its package.
    assert "cpmatrix" in plugin_packages()
