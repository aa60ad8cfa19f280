"""The rule of tests/README.md, checked where a static look can: a module under
``tests/unit`` runs in this process, so it imports nothing that starts a process or a
world, calls nothing that forks or execs, and carries no ``slow``/``docker`` marker.

What it cannot see (a function under test that spawns a compiler, a test that takes
seconds) is for review and ``pytest tests/unit --durations=20``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: Modules that start processes or worlds: the CLI helper, the run holders of the world
#: and pytest-front tests, the runner probes, the cache server.
PROCESS_MODULES = frozenset({
    "subprocess", "multiprocessing", "torch.multiprocessing", "concurrent.futures.process",
    "cli_runner", "world_runs", "pytest_front_runs", "runner_probes", "cache_server_fixture",
})
#: Calls that start a process or join a real process group.
PROCESS_CALLS = frozenset({
    "os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp",
    *(f"os.spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
    *(f"os.exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
    "pty.fork", "pty.spawn", "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell", "dist.init_process_group",
    "torch.distributed.init_process_group", "mp.spawn",
})
#: Markers of tests that need worlds or engines (pyproject's ``markers``).
OUT_OF_PROCESS_MARKERS = frozenset({"slow", "docker"})

#: Unit modules that break the rule but are frozen (hashed by the mutation stamp,
#: tools/mutation-stamp.json: moving them costs a 50-minute re-record). Each entry says
#: what breaks the rule; nothing else may join this list.
FROZEN_EXCEPTIONS = {
    # test_gate_over_a_live_run drives `cpmatrix run` and `cpmatrix gate` (slow).
    "test_gate.py": {"imports subprocess", "marker slow"},
}

#: The folders of tests/ (README.md says what goes in each) and what else may sit there.
FOLDERS = {"unit", "worlds", "e2e", "suite", "resources"}


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for a name or an attribute chain, "" for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def _aliases(tree: ast.AST) -> dict[str, str]:
    """The full dotted name each imported name stands for (``import a.b as c``: c -> a.b;
    ``from os import fork``: fork -> os.fork)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _resolved(node: ast.expr, aliases: dict[str, str]) -> str:
    """:func:`_dotted`, its first name replaced by what it was imported as."""
    head, dot, rest = _dotted(node).partition(".")
    return aliases.get(head, head) + dot + rest


def violations(source: str) -> set[str]:
    """What in a unit test module's ``source`` breaks the rule, one phrase per kind
    (``imports subprocess``, ``calls os.fork``, ``marker slow``): the planted rows below
    show each."""
    found: set[str] = set()
    tree = ast.parse(source)
    aliases = _aliases(tree)
    markers = {f"pytest.mark.{m}" for m in OUT_OF_PROCESS_MARKERS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            names = []
        for name in names:
            for module in PROCESS_MODULES:
                if name == module or name.startswith(module + "."):
                    found.add(f"imports {module}")
        if isinstance(node, ast.Call):
            called = {_dotted(node.func), _resolved(node.func, aliases)} & PROCESS_CALLS
            found.update(f"calls {c}" for c in sorted(called)[:1])
        if isinstance(node, ast.Attribute) and _resolved(node, aliases) in markers:
            found.add(f"marker {node.attr}")
    return found


def _unit_modules() -> list[Path]:
    return sorted((TESTS / "unit").glob("*.py"))


@pytest.mark.parametrize("path", _unit_modules(), ids=lambda p: p.name)
def test_a_unit_test_starts_no_process_and_no_world(path: Path) -> None:
    found = violations(path.read_text(encoding="utf-8"))
    allowed = FROZEN_EXCEPTIONS.get(path.name, set())
    assert found <= allowed, (
        f"tests/unit/{path.name}: {', '.join(sorted(found - allowed))}: a unit test runs in "
        "this process (tests/README.md); move the test to tests/worlds (a real world) or "
        "tests/e2e (the CLI, real processes and engines)")


def test_the_frozen_exceptions_still_break_the_rule() -> None:
    # An exception that no longer applies is removed, so the list only ever shrinks.
    for name, allowed in FROZEN_EXCEPTIONS.items():
        assert violations((TESTS / "unit" / name).read_text(encoding="utf-8")) == allowed, name


@pytest.mark.parametrize(("planted", "phrase"), [
    ("import subprocess\n", "imports subprocess"),
    ("from subprocess import run\n", "imports subprocess"),
    ("from cli_runner import RES\n", "imports cli_runner"),
    ("import multiprocessing.pool\n", "imports multiprocessing"),
    ("from world_runs import Run\n", "imports world_runs"),
    ("import os\nos.fork()\n", "calls os.fork"),
    ("import torch.distributed as dist\ndist.init_process_group('gloo')\n",
     "calls dist.init_process_group"),
    ("import pytest\n@pytest.mark.slow\ndef test_x(): pass\n", "marker slow"),
    ("import pytest\npytestmark = pytest.mark.docker\n", "marker docker"),
    # Spelled through an import alias or a from-import.
    ("from os import fork\nfork()\n", "calls os.fork"),
    ("import os as o\no.fork()\n", "calls os.fork"),
    ("import torch.distributed as td\ntd.init_process_group('gloo')\n",
     "calls torch.distributed.init_process_group"),
    ("from torch.distributed import init_process_group\ninit_process_group('gloo')\n",
     "calls torch.distributed.init_process_group"),
    ("from pytest import mark\n@mark.slow\ndef test_x(): pass\n", "marker slow"),
    # The other ways the standard library starts a process.
    ("import os\nos.spawnlp(os.P_WAIT, 'ls', 'ls')\n", "calls os.spawnlp"),
    ("import os\nos.execvp('ls', ['ls'])\n", "calls os.execvp"),
    ("import pty\npty.fork()\n", "calls pty.fork"),
    ("from pty import spawn\nspawn('ls')\n", "calls pty.spawn"),
    ("import asyncio\nasyncio.create_subprocess_exec('ls')\n",
     "calls asyncio.create_subprocess_exec"),
    ("import asyncio\nasyncio.create_subprocess_shell('ls')\n",
     "calls asyncio.create_subprocess_shell"),
])
def test_the_check_sees_a_planted_violation(planted: str, phrase: str) -> None:
    assert phrase in violations(planted)


def test_the_check_passes_in_process_code() -> None:
    assert violations("import os\nos.getpid()\nimport pytest\n@pytest.mark.parametrize"
                      "('x', [1])\ndef test_x(x): pass\n") == set()


def test_tests_has_the_folders_the_readme_names() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(
        (".", "__"))}
    assert folders == FOLDERS, folders ^ FOLDERS
    readme = (TESTS / "README.md").read_text(encoding="utf-8")
    for folder in FOLDERS:
        assert f"`{folder}/`" in readme, folder
