"""Processes a cell starts (``cpmatrix.worker.follow``), with real subprocesses in this
process: a Python child is followed (what it reads joins the cell's observed set), a
native program, a shell, or a Python child that cannot follow itself makes the cell
unobservable, with the reason; the cache refuses to store such a pass."""

from __future__ import annotations

import doctest
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpmatrix.cache.key import ReadHashes, merge_reads
from cpmatrix.worker import follow
from cpmatrix.worker.follow import UNOBSERVED, merge_signatures
from cpmatrix.worker.observe import ReadObserver, signature
from observed_cells import cell

HELPER = """\
import sys
with open(sys.argv[1] if len(sys.argv) > 1 else "hidden.txt") as f:
    print(f.read().strip())
"""


def test_doctests_run() -> None:
    result = doctest.testmod(follow)
    assert result.failed == 0 and result.attempted >= 8


@pytest.fixture
def obs(tmp_path: Path) -> Iterator[ReadObserver]:
    out = tmp_path / "out"
    observer = ReadObserver(skip=(str(out),), follow=str(out / "follow"))
    yield observer
    observer.active = False


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a data file, a file only the helper names, and the helper."""
    root = tmp_path / "p"
    root.mkdir()
    (root / "data.txt").write_text("1.0\n")
    (root / "hidden.txt").write_text("2.0\n")
    (root / "helper.py").write_text(HELPER)
    monkeypatch.chdir(root)
    return root


def unobserved(reads: dict[str, str]) -> list[str]:
    return [sig[1:] for sig in reads.values() if sig.startswith(UNOBSERVED)]


def test_a_native_program_makes_the_cell_unobservable(obs: ReadObserver,
                                                      project: Path) -> None:
    reads = cell(obs, lambda: subprocess.run(["cat", "data.txt"], check=True,
                                             capture_output=True))
    why = unobserved(reads)
    assert len(why) == 1 and why[0].startswith("it started `cat data.txt`, which reported "
                                               "no reads"), why
    # Its executable and the file its argument names are read all the same.
    assert reads[str(project / "data.txt")] == signature(str(project / "data.txt"))
    cat = next(p for p in reads if p.endswith("/cat"))
    assert reads[cat].startswith("f:")
    assert ReadHashes().settle(reads) == why[0]  # the cache says why and stores nothing


def test_a_python_child_is_followed(obs: ReadObserver, project: Path) -> None:
    """The helper reads ``hidden.txt``, named nowhere in its command line."""
    reads = cell(obs, lambda: subprocess.run([sys.executable, "helper.py"], check=True,
                                             capture_output=True))
    assert unobserved(reads) == []
    assert reads[str(project / "hidden.txt")] == signature(str(project / "hidden.txt"))
    assert reads[str(project / "helper.py")] == signature(str(project / "helper.py"))
    assert not (project.parent / "out" / "follow").exists() or \
        not any((project.parent / "out" / "follow").iterdir())  # the logs are gone
    assert "CPMATRIX_FOLLOW" not in os.environ  # the cell's variables are put back
    assert isinstance(ReadHashes().settle(reads), dict)


def test_a_python_child_that_cannot_follow_itself_is_unobservable(obs: ReadObserver,
                                                                  project: Path) -> None:
    """-I ignores PYTHONPATH; an environment of its own drops CPMATRIX_FOLLOW."""
    isolated = cell(obs, lambda: subprocess.run([sys.executable, "-I", "helper.py"],
                                                check=True, capture_output=True))
    assert unobserved(isolated) and "-I helper.py" in unobserved(isolated)[0]
    bare = cell(obs, lambda: subprocess.run([sys.executable, "helper.py"], check=True,
                                            capture_output=True, env={"PATH": "/usr/bin"}))
    assert unobserved(bare)


def test_a_shell_is_unobservable(obs: ReadObserver, project: Path) -> None:
    assert "through os.system" in unobserved(cell(obs, lambda: os.system("true")))[0]
    shell = cell(obs, lambda: subprocess.run(f"{sys.executable} helper.py", shell=True,
                                             check=True, capture_output=True))
    assert unobserved(shell) and "/bin/sh -c" in unobserved(shell)[0]


def test_a_python_child_of_a_python_child_is_followed_and_so_is_its_native_one(
        obs: ReadObserver, project: Path) -> None:
    (project / "outer.py").write_text(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, 'helper.py'], check=True)\n"
        "subprocess.run(sys.argv[1:], check=True)\n")
    followed = cell(obs, lambda: subprocess.run([sys.executable, "outer.py", "true"],
                                                check=True, capture_output=True))
    assert str(project / "hidden.txt") in followed
    assert unobserved(followed) and "`true`" in unobserved(followed)[0]


def _read_hidden() -> None:
    with open("hidden.txt") as f:
        f.read()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_multiprocessing_children_are_followed(obs: ReadObserver, project: Path,
                                               method: str) -> None:
    def body() -> None:
        child = multiprocessing.get_context(method).Process(target=_read_hidden)
        child.start()
        child.join()
        assert child.exitcode == 0

    reads = cell(obs, body)
    assert unobserved(reads) == []
    assert reads[str(project / "hidden.txt")] == signature(str(project / "hidden.txt"))


def test_without_a_follow_folder_every_start_is_unobservable(tmp_path: Path,
                                                             project: Path) -> None:
    plain = ReadObserver(skip=(str(tmp_path / "out"),))
    try:
        reads = cell(plain, lambda: subprocess.run([sys.executable, "helper.py"],
                                                   check=True, capture_output=True))
    finally:
        plain.active = False
    assert unobserved(reads) and "does not follow" in unobserved(reads)[0]


def test_an_installed_executable_is_trusted_only_when_asked(tmp_path: Path,
                                                            project: Path) -> None:
    """The compile job's ptxas: an executable in a distribution's RECORD."""
    trusting = ReadObserver(skip=(str(tmp_path / "out"),), trust_installed=True)
    exe = os.path.realpath(sys.executable)
    trusting.classifier.record = trusting.classifier.record | {exe}
    try:
        reads = cell(trusting, lambda: subprocess.run([exe, "-c", "pass"], check=True))
        assert unobserved(reads) == []
        trusting.trust_installed = False
        reads = cell(trusting, lambda: subprocess.run([exe, "-c", "pass"], check=True))
        assert unobserved(reads)
    finally:
        trusting.active = False
        trusting.classifier.record = trusting.classifier.record - {exe}


def test_an_unobservable_start_outranks_every_other_reason() -> None:
    reads = {"/a": "!", "start:`cat x`": UNOBSERVED + "it started `cat x`"}
    assert ReadHashes().settle(reads) == "it started `cat x`"
    assert merge_reads([{"k": "?a"}, {"k": "f:1"}]) == {"k": "?a"}
    assert merge_reads([{"k": "f:1"}, {"k": "?b"}]) == {"k": "?b"}
    assert merge_signatures("d:1:2", "p:1:2") == "d:1:2"
    assert merge_signatures("d:1:2", "p:1:3") == "!"


def test_a_start_is_matched_only_by_its_own_childs_log(tmp_path: Path) -> None:
    """Same parent and argv for a spawn, same pid for an exec, a forked log for a fork;
    every start needs a log of its own."""
    logs = tmp_path / "logs"
    logs.mkdir()

    def log(name: str, **header: object) -> None:
        import json
        (logs / name).write_text(json.dumps(header) + "\n" + json.dumps(
            {"r": [f"/{name}", "f:1"]}) + "\n")

    log("a", pid=10, ppid=1, forked=False, argv=["py", "x.py"])
    log("b", pid=11, ppid=1, forked=True, argv=["rank"])
    log("c", pid=11, ppid=1, forked=False, argv=["py", "y.py"])
    starts = [("spawn", 1, ["py", "x.py"]), ("fork", 1, None), ("exec", 11, ["py", "y.py"])]
    sets, unanswered = follow.collect(str(logs), starts)
    assert unanswered == {} and sorted(p for s in sets for p in s) == ["/a", "/b", "/c"]
    for wrong in [("spawn", 2, ["py", "x.py"]), ("spawn", 1, ["py", "z.py"]),
                  ("exec", 12, ["py", "y.py"]), ("fork", 2, None)]:
        _, unanswered = follow.collect(str(logs), [wrong])
        assert len(unanswered) == 1, wrong
    _, unanswered = follow.collect(str(logs), [*starts, ("spawn", 1, ["py", "x.py"])])
    assert len(unanswered) == 1  # two starts, one log
