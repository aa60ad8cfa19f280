"""What the fork launcher imports for a world's test files before the ranks fork
(:mod:`cpmatrix.kinds.pytest.preload`): only unconditional imports of installed modules,
found at the same place by the rank, never a pytest plugin's package or the project's."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from cpmatrix.kinds.pytest.preload import (
    early_imports,
    files_to_read,
    installed_imports,
    plugin_packages,
    preload,
    quiet_conftest,
    rewritten_names,
    unconditional_imports,
)


def test_only_the_leading_imports_before_any_other_code() -> None:
    tree = ast.parse(
        '"doc"\nfrom __future__ import annotations\nimport a, b.c\nfrom d.e import f\n'
        "try:\n    import i\nexcept ImportError:\n    import k\n"
        "import os\nos.environ['X'] = '1'\nimport after_code\n"
        "if X:\n    import g\ndef l():\n    import m\nfrom . import r\n")
    assert unconditional_imports(tree) == ["a", "b.c", "d.e", "i", "os"]
    # A try with more than imports is code: the scan stops there.
    assert unconditional_imports(ast.parse("import a\ntry:\n    x = 1\n    import b\n"
                                           "except E:\n    pass\nimport c\n")) == ["a"]


def test_a_conftest_that_runs_code_of_its_own_is_not_quiet() -> None:
    quiet = ('"doc"\nimport pytest\nimport torch\npytest_plugins = ["x"]\n'
             "@pytest.fixture(scope='session')\ndef f():\n    return os.environ['A']\n"
             "class Helper:\n    pass\n")
    assert quiet_conftest(ast.parse(quiet))
    for loud in ("import os\nos.environ['A'] = '1'\n",
                 "def pytest_configure(config):\n    pass\n",
                 "import functools\n@functools.lru_cache\ndef f():\n    pass\n",
                 "X = compute()\n", "if True:\n    import a\n"):
        assert not quiet_conftest(ast.parse(loud)), loud


def test_modules_pytest_rewrites_are_named() -> None:
    trees = [ast.parse("pytest_plugins = ['helpers.fixtures', 'other']\n"),
             ast.parse("import pytest\npytest.register_assert_rewrite('checks.deep', 'x')\n"),
             ast.parse("pytest_plugins = 'single'\n")]
    assert rewritten_names(trees, ["-p", "myplug", "-pdirect", "-p", "no:cacheprovider"]) \
        == {"helpers", "other", "checks", "x", "single", "myplug", "direct"}


def test_a_test_file_under_a_loud_conftest_gets_no_early_imports(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _write(site, "cpmx_q_inst/__init__.py")
    _write(site, "cpmx_q_rewritten/__init__.py")
    quiet = _write(tmp_path / "suite" / "quiet", "test_q.py",
                   "import cpmx_q_inst\nimport cpmx_q_rewritten\n")
    _write(tmp_path / "suite" / "quiet", "conftest.py",
           "pytest_plugins = ['cpmx_q_rewritten']\n")
    loud = _write(tmp_path / "suite" / "loud", "test_l.py", "import cpmx_q_inst\n")
    _write(tmp_path / "suite" / "loud", "conftest.py", "import os\nos.environ['A'] = '1'\n")
    sys.path.insert(0, str(site))
    try:
        def installed(path: str) -> bool:
            return path.startswith(str(site))

        root = str(tmp_path / "suite")
        assert early_imports([str(quiet)], root, list(sys.path), installed) == ["cpmx_q_inst"]
        assert early_imports([str(loud)], root, list(sys.path), installed) == []
    finally:
        sys.path.remove(str(site))


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
