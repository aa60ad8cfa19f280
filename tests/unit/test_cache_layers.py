"""Which remote cache a run uses, and the portable paths of keys and entries (no worlds).

The runs themselves (two checkouts sharing passes through a real nginx) are in
tests/e2e/test_remote_cache_run.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cpmatrix.cache.key import ReadHashes, ResultCache
from cpmatrix.cache.layers import CacheLayers, remote_settings
from cpmatrix.cache.portable import Anchors
from cpmatrix.cache.toolchain import Interpreter
from cpmatrix.errors import SpecError, UsageError
from cpmatrix.matrix.load import load_matrix
from cpmatrix.result import Result, Status
from cpmatrix.supervise.options import RunOptions
from cpmatrix.worker.observe import signature

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
    assert remote_settings(RunOptions().caching, m).display == "https://team.example.com/cp"
    cli = RunOptions(remote_cache="http://127.0.0.1:8765/mine")
    assert remote_settings(cli.caching, m).display == "http://127.0.0.1:8765/mine"
    assert remote_settings(RunOptions(remote_cache="").caching, m) is None
    assert remote_settings(RunOptions(no_cache=True).caching, m) is None
    assert remote_settings(RunOptions(no_cache=True, remote_cache="http://h/").caching, m) is None
    ro = remote_settings(RunOptions(remote_cache_read_only=True).caching, m)
    assert ro is not None and ro.read_only
    # Read-only with no remote at all: nothing to do (one CI line for every project).
    assert remote_settings(RunOptions(remote_cache_read_only=True).caching,
                           load_matrix(_matrix(tmp_path))) is None


def test_a_committed_read_only_setting(tmp_path: Path) -> None:
    m = load_matrix(_matrix(tmp_path, "remote_cache: {url: 'http://h:9/x', read_only: true}\n"))
    found = remote_settings(RunOptions().caching, m)
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
        remote_settings(RunOptions().caching, load_matrix(path))
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


def _layers(cache: Path, out: Path) -> CacheLayers:
    return CacheLayers(ResultCache(cache), None, {"c": "cd" * 32}, out=out)


def test_a_pass_is_stored_with_its_logs_and_a_hit_puts_them_back(tmp_path: Path) -> None:
    cell: Any = SimpleNamespace(id="c")
    fresh = tmp_path / "fresh"
    (fresh / "cells" / "c" / "rank0").mkdir(parents=True)
    (fresh / "cells" / "c" / "rank1").mkdir(parents=True)
    (fresh / "cells" / "c" / "rank0" / "output.log").write_text("rank 0 says hello\n")
    (fresh / "cells" / "c" / "rank1" / "output.log").write_text("x" * 70_000 + "END\n")
    layers = _layers(tmp_path / "cache", fresh)
    layers.store(cell, Result(cell_id="c", status=Status.PASSED, out_dir="cells/c"), {})
    entry = ResultCache(tmp_path / "cache").read("cd" * 32)
    assert isinstance(entry, dict)
    logs = entry["logs"]
    assert logs["0"] == "rank 0 says hello\n"
    assert logs["1"].startswith("[... ") and logs["1"].endswith("END\n")  # the tail, capped
    assert len(logs["1"]) < 66_000
    # Another run (another output folder) hits it: the logs come back after the run.
    later = tmp_path / "later"
    again = _layers(tmp_path / "cache", later)
    (hit,) = again.lookup([cell]).values()
    assert hit.status is Status.CACHED
    assert not (later / "cells").exists()  # not at lookup: the run clears cell folders
    assert again.finish() == []
    put_back = (later / "cells" / "c" / "rank0" / "output.log").read_text()
    head, _, rest = put_back.partition("\n")
    assert head.startswith("[cpmatrix: cached; the output of the run that stored this pass")
    assert entry["stored_at"] in head and rest == "rank 0 says hello\n"
    assert (later / "cells" / "c" / "rank1" / "output.log").read_text().endswith("END\n")


def test_logs_are_evidence_only(tmp_path: Path) -> None:
    cell: Any = SimpleNamespace(id="c")
    layers = _layers(tmp_path / "cache", tmp_path / "fresh")  # a pass that printed nothing
    layers.store(cell, Result(cell_id="c", status=Status.PASSED, out_dir="cells/c"), {})
    cache = ResultCache(tmp_path / "cache")
    entry = cache.read("cd" * 32)
    assert isinstance(entry, dict) and entry["logs"] == {}
    # Damaged logs in an entry: still the same cached pass, the damaged logs left out.
    entry["logs"] = {"0": 5, "x": "no rank", "2": "kept\n"}
    cache.write("cd" * 32, entry)
    later = tmp_path / "later"
    again = _layers(tmp_path / "cache", later)
    assert [r.status for r in again.lookup([cell]).values()] == [Status.CACHED]
    again.finish()
    assert sorted(p.parent.name for p in (later / "cells" / "c").glob("*/output.log")) == \
        ["rank2"]
    # A failure is never stored, logs or not.
    _layers(tmp_path / "c2", tmp_path / "fresh").store(
        cell, Result(cell_id="c", status=Status.FAILED, out_dir="cells/c"), {})
    assert ResultCache(tmp_path / "c2").read("cd" * 32) is None
