"""``pytest --cpmatrix`` on small suites in the shapes real upstream suites have (issue 29),
each compared test for test with its native run.

Each suite in ``tests/resources/pytest_front_suites/shapes`` is written for these tests
(no upstream code); each test here runs one of them natively and with ``--cpmatrix`` and
asserts every test ends the same way.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_front_runs import SUITES, Run, pytest_run, torchrun_run

pytestmark = pytest.mark.slow


def _both(tmp: Path, target: str, *extra: str) -> tuple[Run, Run]:
    native = pytest_run([*extra, target], tmp / "native.xml")
    front = pytest_run(["--cpmatrix", f"--cpmatrix-out={tmp / 'out'}", *extra, target],
                       tmp / "front.xml")
    return native, front


def _same(native: Run, front: Run, count: int) -> None:
    assert len(native.outcomes) == count, native.output[-3000:]
    assert front.outcomes == native.outcomes, front.output[-4000:]
    assert front.rc == native.rc, front.output[-3000:]


def test_classes_that_run_in_one_process_run_here_as_natively(tmp_path: Path) -> None:
    # LocalTensor (a fake group of 2 in this process), threads, a plain TestCase: only
    # the class that spawns its ranks is multi-rank.
    native, front = _both(tmp_path, "shapes/test_one_process.py")
    _same(native, front, 6)
    assert native.outcomes[
        "shapes.test_one_process.SpawnedWithLocalTensor::test_skipped_in_local_mode"] \
        == "skipped"
    assert "cpmatrix: 2 multi-rank tests in" in front.output


def test_a_read_only_world_size_property_of_a_continuous_class(tmp_path: Path) -> None:
    native, front = _both(tmp_path, "shapes/test_property_world.py")
    _same(native, front, 2)
    assert set(front.outcomes.values()) == {"passed"}


def test_tmp_path_and_friends_work_in_every_rank(tmp_path: Path) -> None:
    native, front = _both(tmp_path, "shapes/test_tmp_path.py")
    _same(native, front, 1)
    assert set(front.outcomes.values()) == {"passed"}


def test_the_out_option_in_its_space_form_on_a_fresh_folder(tmp_path: Path) -> None:
    # No ini file: pytest takes the rootdir from the paths on the command line, and
    # reads `--cpmatrix-out DIR` (a plugin's option) as one of them. DIR does not exist
    # when the controller looks, it does when the ranks do: they must not look again.
    suite = tmp_path / "suite"
    suite.mkdir()
    test = SUITES / "shapes" / "test_property_world.py"
    (suite / test.name).write_text(test.read_text())
    out = tmp_path / "out"
    run = pytest_run(["--cpmatrix", "--cpmatrix-out", str(out), test.name],
                     tmp_path / "front.xml", cwd=suite)
    assert run.rc == 0, run.output[-4000:]
    assert run.outcomes == {"test_property_world.PropertySized::test_all_reduce": "passed",
                            "test_property_world.PropertySized::test_rank_and_size": "passed"}


def _messages(junit: Path) -> dict[str, str]:
    """Each test's failure or error ``message`` attribute (what a CI shows first)."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                key = f"{case.get('classname', '')}::{case.get('name', '')}"
                out[key] = out.get(key, "") + (child.get("message") or "")
    return out


def test_every_rank_report_counts_and_junit_names_the_failing_rank(tmp_path: Path) -> None:
    torch_file, marker_file = "shapes/test_verdicts_torch.py", "shapes/test_verdicts_marker.py"
    native = pytest_run([torch_file], tmp_path / "native.xml").outcomes
    native.update(torchrun_run(2, [marker_file], tmp_path / "torchrun").outcomes)
    front = pytest_run(["--cpmatrix", f"--cpmatrix-out={tmp_path / 'out'}", torch_file,
                        marker_file], tmp_path / "front.xml")
    assert len(native) == 5
    assert front.outcomes == native, front.output[-4000:]
    assert sorted(native.values()) == ["error", "failed", "failed", "failed", "xfailed"]
    # The failing rank in the message itself (junit_logging = no drops report sections).
    messages = _messages(tmp_path / "front.xml")
    for name in ("test_verdicts_marker::test_strict_xfail_passes_on_rank_one",
                 "test_verdicts_marker::test_teardown_fails_on_rank_one",
                 "test_verdicts_torch.Verdicts::test_subtest_fails_on_rank_one"):
        assert "[rank 1]" in messages[f"shapes.{name}"], messages


def test_shapes_cpmatrix_cannot_run_keep_their_native_outcome(tmp_path: Path) -> None:
    native, front = _both(tmp_path, "shapes/test_native_shapes.py")
    _same(native, front, 3)
    assert sorted(native.outcomes.values()) == ["passed", "skipped", "skipped"]
    # One line per class run natively, saying why.
    assert ("cpmatrix: shapes/test_native_shapes.py::PinnedToNccl: runs as without "
            "cpmatrix: its class pins backend 'nccl'") in front.output
    assert "shapes/test_native_shapes.py::SizedByGpus: runs as without cpmatrix: " \
        "world_size 0" in front.output


def test_a_tests_store_keys_are_not_read_by_the_next(tmp_path: Path) -> None:
    native, front = _both(tmp_path, "shapes/test_store_keys.py")
    _same(native, front, 3)
    assert set(front.outcomes.values()) == {"passed"}
    assert "Connection refused" not in front.output


def test_deepspeed_classes_get_what_its_launcher_gives(tmp_path: Path) -> None:
    # LOCAL_SIZE, the group and a barrier before the method; a class with
    # init_distributed = False has no group (it runs natively, with a note).
    native, front = _both(tmp_path, "dialects/deepspeed")
    _same(native, front, 6)
    assert front.outcomes["dialects.deepspeed.test_deepspeed_dialect.TestWorldSizeMarker"
                          "::test_one_rank"] == "passed"  # @pytest.mark.world_size(1)
    assert front.outcomes["dialects.deepspeed.test_deepspeed_dialect.TestLauncherEnvironment"
                          "::test_local_size_and_the_group"] == "passed"
    assert "TestWithoutInit: runs as without cpmatrix: its class sets init_distributed = " \
        "False" in front.output


def test_a_group_deepspeed_kept_is_forgotten_with_the_test(tmp_path: Path) -> None:
    # The library keeps the group the first test made in a module global (DeepSpeed's
    # utils.groups); cpmatrix destroys the test's groups after it. Destroyed through
    # DeepSpeed's own comm, the library forgets it and the next test makes its own, as
    # natively (fresh processes): not "Group ... is not registered".
    native, front = _both(tmp_path, "dialects/deepspeed_groups")
    _same(native, front, 2)
    assert set(front.outcomes.values()) == {"passed"}


def test_a_failing_or_skipping_rank_cuts_its_waiting_peer_off_at_once(tmp_path: Path) -> None:
    # The peer blocked in the collective is told (its group's connections closed), is
    # not blamed, and the world goes on: one world start for the three tests (a world
    # torn down after the failure's grace period would start again for the next test).
    target = "shapes/test_cut_off.py"
    native = pytest_run(["-k", "not skips", target], tmp_path / "native.xml")
    front = pytest_run(["--cpmatrix", f"--cpmatrix-out={tmp_path / 'out'}", target],
                       tmp_path / "front.xml")
    key = "shapes.test_cut_off.CutOff::test_"
    assert native.outcomes == {f"{key}a_fails_on_rank_one_while_peer_waits": "failed",
                               f"{key}c_passes_after_them": "passed"}, native.output[-3000:]
    assert front.outcomes == {**native.outcomes,
                              f"{key}b_skips_on_rank_zero_while_peer_waits": "failed"}, \
        front.output[-4000:]
    messages = _messages(tmp_path / "front.xml")
    assert "[rank 1]" in messages[f"{key}a_fails_on_rank_one_while_peer_waits"], messages
    failed = front.texts[f"{key}a_fails_on_rank_one_while_peer_waits"]
    assert "rank 0 did not finish the call phase (cut off while waiting for the failing " \
        "rank)" in failed, failed
    assert "planted: rank 1 fails" in failed
    skipped = messages[f"{key}b_skips_on_rank_zero_while_peer_waits"]
    assert "skip not agreed: skipped on rank 0 (planted: rank 0 only), rank 1 cut off " \
        "waiting for it in a collective" in skipped, skipped
    assert "(1 world start)" in front.output, front.output[-3000:]


def test_pytest_exit_in_a_spawned_ranks_body_fails_only_its_test(tmp_path: Path) -> None:
    # torch's worker catches it as any exception: the test fails, the next one runs.
    native, front = _both(tmp_path, "shapes/test_exit_in_body.py")
    _same(native, front, 2)
    assert sorted(native.outcomes.values()) == ["failed", "passed"]


def test_pytest_exit_in_a_fixture_ends_the_session_as_natively(tmp_path: Path) -> None:
    # The fixture runs in the pytest process natively: the session ends with the exit's
    # return code, the tests before it reported, the exiting one and those after it not.
    native, front = _both(tmp_path, "shapes/test_exit_in_fixture.py")
    _same(native, front, 1)
    assert native.rc == 3
    assert "Exit: planted pytest.exit in a fixture" in front.output


def test_the_users_build_cache_is_found_by_the_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each world has a HOME of its own, but what the user's runs built into the user's
    # cache folder (~/.cache/torch_extensions) is found, as natively.
    home = tmp_path / "home"
    built = home / ".cache" / "cpmatrix_shape_extensions" / "built"
    built.parent.mkdir(parents=True)
    built.write_text("a build of an earlier run\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    native, front = _both(tmp_path, "shapes/test_user_cache.py")
    _same(native, front, 1)
    assert set(native.outcomes.values()) == {"passed"}


def _distribution(site: Path, name: str, plugin: bool) -> None:
    """An installed (non-editable) distribution: a package and a RECORD naming its files;
    ``plugin``: it registers a ``pytest11`` plugin (its top module)."""
    pkg = site / name
    pkg.mkdir(parents=True)
    loaded = "import os\nLOADED_IN = os.getpid()\n"
    (pkg / "__init__.py").write_text(loaded)
    (pkg / "extra.py").write_text(loaded)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{name}/extra.py,,\n"
                                 f"{name}-1.0.dist-info/METADATA,,\n"
                                 f"{name}-1.0.dist-info/RECORD,,\n")
    if plugin:
        (info / "entry_points.txt").write_text(f"[pytest11]\n{name} = {name}\n")


def test_installed_modules_the_tests_import_are_imported_once_before_the_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _distribution(site, "cpmx_shape_installed", plugin=False)
    _distribution(site, "cpmx_shape_plugin", plugin=True)
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), path) if p))
    facts = tmp_path / "facts"
    facts.mkdir()
    monkeypatch.setenv("CPMATRIX_SHAPE_FACTS", str(facts))
    front = pytest_run(["--cpmatrix", f"--cpmatrix-out={tmp_path / 'out'}",
                        "shapes/test_preloaded.py"], tmp_path / "front.xml")
    assert set(front.outcomes.values()) == {"passed"}, front.output[-4000:]
    ranks = [json.loads(p.read_text()) for p in facts.glob("*.json")]
    assert len(ranks) == 2, front.output[-3000:]
    # The installed module: imported once, by the launcher, before either rank existed.
    assert len({r["installed"] for r in ranks}) == 1
    assert all(r["installed"] != r["pid"] for r in ranks)
    # The plugin's package: imported by each rank's own pytest session, never earlier.
    assert all(r["plugin"] == r["pid"] for r in ranks)
    launcher = (tmp_path / "out").glob("worlds/*/torchrun.log")
    assert any(re.search(r"imported [1-9]\d* installed modules", p.read_text())
               for p in launcher)
