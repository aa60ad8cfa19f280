"""The remote cache in real runs: the real CLI, real gloo worlds, a real nginx WebDAV server.

``resources/remote_project`` is copied to two folders, two checkouts at different paths,
each with a local cache of its own; the project commits a ``remote_cache:`` setting
naming the server. Three runs, in one module fixture:

1. **A writes** (the setting, as main's CI): the passes go to both caches; the cell that
   crashed once and passed when retried (FLAKY) goes to neither. Then checkout A is
   deleted, so no absolute path of A can still hold what its cells read.
2. **B reads** (``--remote-cache-read-only``, as a pull request), with one case edited,
   one data file edited and one stored blob tampered with on the server: the untouched
   cell is ``cached`` from the remote (and adopted by B's local cache), the edited case
   misses, the cell whose data file differs misses (its entry's observed set is
   re-checked here, as a local hit's), the tampered one is a reported miss; the
   server's folder is byte for byte as before.
3. **An unreachable remote** (``--remote-cache`` on a dead port: the command line wins
   over the setting) with an empty local cache: one warning, every cell runs, exit 0.
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cache_server_fixture import serve
from cli_runner import RES, run_cli
from cpmatrix.cache.reapi import ActionResult
from world_runs import Run, read_run

pytestmark = pytest.mark.slow

PASSING = ("alpha", "beta", "delta", "gamma")
ENTRY = "cpmatrix/entry.json"


@dataclass
class Story:
    server: Any
    root: Path
    runs: dict[str, Run] = field(default_factory=dict)
    #: The server's files after run 1 (path -> bytes) and after tampering (before run 2).
    after_write: dict[str, bytes] = field(default_factory=dict)
    before_read: dict[str, bytes] = field(default_factory=dict)
    after_read: dict[str, bytes] = field(default_factory=dict)
    tampered: str = ""
    #: What alpha's rank 0 printed in run 1 (its cell folder's output log), and its
    #: output log in run 2, where it was a remote hit.
    alpha_log: str = ""
    alpha_log_hit: str = ""


def _checkout(root: Path, name: str, url: str) -> Path:
    project = root / name / "project"
    shutil.copytree(RES / "remote_project", project)
    with open(project / "matrix.yaml", "a", encoding="utf-8") as f:
        f.write(f"remote_cache: {url}\n")
    return project


def _run(project: Path, cache: Path, *extra: str) -> Run:
    out = project / "out"
    proc = run_cli("run", "--matrix", str(project / "matrix.yaml"), "--out", str(out),
                   "--cache-dir", str(cache), "--plain", *extra, timeout=300)
    # A run that crashed writes no results: its tests fail, the other runs' still judge.
    return read_run(out, proc.returncode, proc.stdout, stderr=proc.stderr, required=False)


def _files(data: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data)): p.read_bytes() for p in sorted(data.rglob("*"))
            if p.is_file()}


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    root = tmp_path_factory.mktemp("remote")
    for server in serve(root / "server"):
        s = Story(server=server, root=root)
        url = server.url + "/ci"
        data = Path(server.root) / "data"
        # 1. checkout A writes, through the committed setting.
        a = _checkout(root, "a", url)
        s.runs["write"] = _run(a, root / "a" / "cache")
        s.after_write = _files(data)
        (log,) = (a / "out" / "cells").glob("alpha[[]*/rank0/output.log")
        s.alpha_log = log.read_text()
        shutil.rmtree(a.parent)
        # 2. checkout B, elsewhere, reads only: beta edited, gamma's stored blob tampered.
        b = _checkout(root, "checkout-b", url)
        case = b / "cases" / "remote_beta.py"
        case.write_text(case.read_text().replace("2.0", "2.5"))
        (b / "data" / "delta.txt").write_text("7\n")
        gamma = s.runs["write"].by_target()["gamma"]
        for name, blob in s.after_write.items():
            if name.startswith("ci/cas/") and b'"gamma[' in blob:
                # Same length, still a well-formed pass: only the hash can tell.
                forged = blob.replace(b'"value": 4.0', b'"value": 9.0')
                assert forged != blob
                (data / name).write_bytes(forged)
                s.tampered = name
        assert s.tampered, f"no blob of gamma on the server ({gamma['cell_id']})"
        s.before_read = _files(data)
        s.runs["read"] = _run(b, root / "b-cache", "--remote-cache-read-only")
        s.after_read = _files(data)
        (log,) = (b / "out" / "cells").glob("alpha[[]*/rank0/output.log")
        s.alpha_log_hit = log.read_text()
        # 3. an unreachable remote named on the command line, with an empty local cache.
        s.runs["down"] = _run(b, root / "b-cache-2", "--remote-cache",
                              f"http://127.0.0.1:{_dead_port()}/ci")
        yield s


def _ac_entries(files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    """Key -> the cpmatrix entry each action entry on the server points at."""
    out = {}
    for name, raw in files.items():
        if name.startswith("ci/ac/"):
            (entry,) = ActionResult.decode(raw).outputs
            assert entry.path == ENTRY
            out[name.rsplit("/", 1)[1]] = json.loads(files[f"ci/cas/{entry.digest.hash}"])
    return out


def test_main_writes_every_first_attempt_pass_and_never_the_flaky_one(story: Story) -> None:
    run = story.runs["write"]
    # The FLAKY cell is not ok for the exit code.
    assert run.returncode == 1, run.stdout + run.stderr
    assert {n: r["status"] for n, r in run.by_target().items()} == {
        "alpha": "passed", "beta": "passed", "delta": "passed", "gamma": "passed",
        "retried": "flaky"}
    entries = _ac_entries(story.after_write)
    # Exactly the four passes, under their keys, as real ActionResults pointing at blobs.
    assert sorted(e["result"]["cell_id"].split("[")[0] for e in entries.values()) == \
        sorted(PASSING)
    assert all(e["key"] == k and e["result"]["attempts"] == 1 for k, e in entries.items())
    remote = run.run_json["cache"]["remote"]
    assert (remote["uploads"], remote["hits"], remote["misses"]) == (4, 0, 5), remote
    assert "remote cache http://127.0.0.1:" in run.stdout and "4 uploads" in run.stdout


def test_entries_name_project_files_relative_to_the_project(story: Story) -> None:
    (alpha,) = [e for e in _ac_entries(story.after_write).values()
                if e["result"]["cell_id"].startswith("alpha[")]
    reads = alpha["reads"]
    assert "$project/data/value.txt" in reads and "$project/cases/remote_alpha.py" in reads
    assert not [p for p in reads if str(story.root) in p], reads


def test_another_checkout_hits_the_untouched_cell_from_the_remote(story: Story) -> None:
    run = story.runs["read"]
    alpha = run.by_target()["alpha"]
    assert alpha["status"] == "cached", alpha
    assert "(remote cache http://127.0.0.1:" in alpha["message"]
    assert alpha["evidence"]["cached_from"].endswith("/ci")
    # Adopted by B's local cache: the next run of B hits locally.
    assert len(list((story.root / "b-cache" / "results").rglob("*.json"))) == 4
    assert "(1 local, 0 remote)" not in run.stdout and "(0 local, 1 remote)" in run.stdout


def test_a_remote_hit_brings_the_logs_of_the_run_that_stored_it(story: Story) -> None:
    assert "alpha read 3.0\n" in story.alpha_log
    (alpha,) = [e for e in _ac_entries(story.after_write).values()
                if e["result"]["cell_id"].startswith("alpha[")]
    assert alpha["logs"]["0"] == story.alpha_log  # in the verified blob, as printed
    head, _, rest = story.alpha_log_hit.partition("\n")
    assert head == ("[cpmatrix: cached; the output of the run that stored this pass at "
                    f"{alpha['stored_at']}]") and rest == story.alpha_log


def test_an_edited_case_misses_and_runs(story: Story) -> None:
    beta = story.runs["read"].by_target()["beta"]
    assert beta["status"] == "passed" and beta["evidence"]["value"] == 2.5, beta


def test_a_remote_entry_whose_files_differ_here_is_a_miss(story: Story) -> None:
    run = story.runs["read"]
    delta = run.by_target()["delta"]
    assert delta["status"] == "passed" and delta["evidence"]["value"] == 7.0, delta
    remote = run.run_json["cache"]["remote"]
    assert remote["stale"] == 1, remote
    assert any("$project/data/delta.txt does not hold" in n for n in remote["notes"]), remote


def test_a_tampered_blob_is_a_reported_miss(story: Story) -> None:
    run = story.runs["read"]
    gamma = run.by_target()["gamma"]
    assert gamma["status"] == "passed" and gamma["evidence"]["value"] == 4.0, gamma
    remote = run.run_json["cache"]["remote"]
    assert (remote["hits"], remote["corrupt"], remote["misses"]) == (1, 1, 4), remote
    assert "1 failed verification" in run.stdout
    assert any("does not match its digest" in n for n in remote["notes"]), remote["notes"]
    assert "miss: " in run.stdout


def test_read_only_never_writes(story: Story) -> None:
    run = story.runs["read"]
    assert run.run_json["cache"]["remote"]["read_only"] is True
    assert run.run_json["cache"]["remote"]["uploads"] == 0
    assert story.after_read == story.before_read  # beta's and gamma's passes not uploaded
    assert "(read-only)" in run.stdout


def test_an_unreachable_remote_warns_once_and_the_run_goes_on(story: Story) -> None:
    run = story.runs["down"]
    assert run.returncode == 0, run.stdout + run.stderr  # retried passes now: its marker exists
    assert {n: r["status"] for n, r in run.by_target().items()} == {
        n: "passed" for n in (*PASSING, "retried")}, run.results
    assert run.stderr.count("warning: remote cache http://127.0.0.1:") == 1, run.stderr
    assert "going on with the local cache only" in run.stderr
    remote = run.run_json["cache"]["remote"]
    assert remote["disabled"] and remote["hits"] == 0 and remote["uploads"] == 0, remote
    # The command line won over the committed setting (the live server was not asked).
    assert remote["url"] != story.server.url + "/ci"
    assert len(list((story.root / "b-cache-2" / "results").rglob("*.json"))) == 5
