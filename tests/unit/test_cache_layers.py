"""Which remote cache a run uses, and the portable paths of keys and entries (no worlds).

The runs themselves (two checkouts sharing passes through a real nginx) are in
tests/e2e/test_remote_cache_run.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmatrix.errors import SpecError, UsageError
from cpmatrix.matrix.load import load_matrix
from cpmatrix.remote.observe import signature
from cpmatrix.result import Result, Status
from cpmatrix.run.cache import ReadHashes, ResultCache
from cpmatrix.run.cache_layers import remote_settings
from cpmatrix.run.options import RunOptions
from cpmatrix.run.portable import Anchors
from cpmatrix.run.toolchain import Interpreter

HEAD = """\
version: 1
platforms: {cpu: {backend: gloo, device: cpu}}
targets: [{name: t, case: "cpmatrix.suite.cases.ring:case", level: unit}]
"""


def _matrix(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + extra)
    return path


def test_the_command_line_wins_over_the_setting_and_no_cache_turns_both_off(
        tmp_path: Path) -> None:
    m = load_matrix(_matrix(tmp_path, "remote_cache: https://team.example.com/cp\n"))
    assert remote_settings(RunOptions(), m).display == "https://team.example.com/cp"
    cli = RunOptions(remote_cache="http://127.0.0.1:8765/mine")
    assert remote_settings(cli, m).display == "http://127.0.0.1:8765/mine"
    assert remote_settings(RunOptions(remote_cache=""), m) is None
    assert remote_settings(RunOptions(no_cache=True), m) is None
    assert remote_settings(RunOptions(no_cache=True, remote_cache="http://h/"), m) is None
    ro = remote_settings(RunOptions(remote_cache_read_only=True), m)
    assert ro is not None and ro.read_only
    # Read-only with no remote at all: nothing to do (one CI line for every project).
    assert remote_settings(RunOptions(remote_cache_read_only=True),
                           load_matrix(_matrix(tmp_path))) is None


def test_a_committed_read_only_setting(tmp_path: Path) -> None:
    m = load_matrix(_matrix(tmp_path, "remote_cache: {url: 'http://h:9/x', read_only: true}\n"))
    found = remote_settings(RunOptions(), m)
    assert found is not None and found.read_only and found.prefix == "/x"


@pytest.mark.parametrize(("setting", "says"), [
    ("remote_cache: http://me:secret@cache.example.com/\n", "holds credentials"),
    ("remote_cache: ftp://cache.example.com/\n", "is not an http:// or https:// URL"),
    ("remote_cache: {url: 'http://h:99999/'}\n", "invalid port"),
])
def test_a_bad_setting_is_a_spec_error_naming_file_and_line(
        tmp_path: Path, setting: str, says: str) -> None:
    path = _matrix(tmp_path, setting)
    with pytest.raises(SpecError) as err:
        remote_settings(RunOptions(), load_matrix(path))
    message = str(err.value)
    assert message.startswith(f"{path}:4:") and "remote_cache:" in message, message
    assert says in message and "secret" not in message, message


@pytest.mark.parametrize(("setting", "says"), [
    ("remote_cache: {read_only: true}\n", "missing 'url'"),
    ("remote_cache: {url: 'http://h/', read_only: maybe}\n", "must be true or false"),
    ("remote_cache: {url: 'http://h/', token: x}\n", "unknown key 'token'"),
])
def test_a_malformed_setting_is_refused_when_loaded(tmp_path: Path, setting: str,
                                                     says: str) -> None:
    with pytest.raises(SpecError, match=says):
        load_matrix(_matrix(tmp_path, setting))


def test_a_url_with_credentials_on_the_command_line_is_exit_2() -> None:
    with pytest.raises(UsageError, match="holds credentials"):
        RunOptions(remote_cache="https://u:p@cache.example.com/")


def test_the_toolchain_key_names_no_folder_of_this_machine() -> None:
    def probe(project: str, prefix: str) -> dict[str, str]:
        found = Interpreter(
            binary="ab" * 32, version="3.11.7", prefix=prefix, dists=("torch==2.13.0",),
            path=("/usr/lib/python311.zip", f"{prefix}/lib/python3.11/site-packages",
                  f"{project}/src"),
            pth=((f"{prefix}/lib/python3.11/site-packages", "__editable__.x.pth",
                  f"{project}/src\n"),))
        return found.identity(found.anchors(project))

    here = probe("/home/ci/proj", "/home/ci/proj/.venv")
    assert here == probe("/tmp/elsewhere/p", "/opt/venvs/p")
    # A .pth pointing outside the prefix, or another binary, is another key.
    moved = Interpreter(binary="ab" * 32, version="3.11.7", prefix="/v", dists=(),
                        path=(), pth=(("/v", "x.pth", "/somewhere/else/src\n"),))
    same = Interpreter(binary="ab" * 32, version="3.11.7", prefix="/v", dists=(),
                       path=(), pth=(("/v", "x.pth", "/v/src\n"),))
    assert moved.identity(moved.anchors("/p")) != same.identity(same.anchors("/p"))
    other = Interpreter(binary="cd" * 32, version="3.11.7", prefix="/v", dists=(),
                        path=(), pth=(("/v", "x.pth", "/v/src\n"),))
    assert other.identity(other.anchors("/p")) != same.identity(same.anchors("/p"))


def test_an_entry_written_in_one_checkout_is_checked_against_the_others_files(
        tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "proj", tmp_path / "checkout-b"
    for root in (a, b):
        (root / "data").mkdir(parents=True)
        (root / "data" / "v.txt").write_text("3\n")
    hashes = ReadHashes()
    writer = ResultCache(tmp_path / "cache-a", hashes, Anchors.of(project=str(a)))
    settled = hashes.settle({str(a / "data" / "v.txt"): signature(str(a / "data" / "v.txt"))})
    assert isinstance(settled, dict)
    entry = writer.entry("ab" * 32, Result(cell_id="c", status=Status.PASSED), settled)
    assert entry is not None and entry["reads"] == {"$project/data/v.txt": settled[
        str(a / "data" / "v.txt")]}
    reader = ResultCache(tmp_path / "cache-b", ReadHashes(), Anchors.of(project=str(b)))
    found = reader.check(entry, "ab" * 32, "c")
    assert isinstance(found, Result) and found.status is Status.CACHED
    (b / "data" / "v.txt").write_text("4\n")  # same path in b, other bytes: a miss
    assert ResultCache(tmp_path / "c", ReadHashes(), Anchors.of(project=str(b))).check(
        entry, "ab" * 32, "c") == "$project/data/v.txt does not hold what the cell read"
