"""A cell's verdict depends on its own code alone (issue 21, rows 1-3 and 8-12).

Real gloo worlds through the real CLI. Two module-scoped runs hold every adversarial
cell: ``tests/resources/isolation.yaml`` one at a time (``--keep-order``: each leaver is
followed on the same ranks by the cell it would fool), and
``tests/resources/isolation_slots.yaml`` side by side (``--world-ranks 4``: a checkpoint
writer beside its reader, then environment checks on reused groups of world ranks 2-3).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_runner import RES, pid_alive, results_by_target, run_cli, wait_for

SERIAL = RES / "isolation.yaml"
SLOTS = RES / "isolation_slots.yaml"


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("isolation") / "out"
    proc = run_cli("run", "--matrix", str(SERIAL), "--keep-order", "--abort-grace", "2",
                   "--no-cache", "--plain", "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr, out, results_by_target(out)


@pytest.fixture(scope="module")
def slots(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("isolation-slots") / "out"
    proc = run_cli("run", "--matrix", str(SLOTS), "--world-ranks", "4", "--abort-grace", "2",
                   "--no-cache", "--plain", "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr, out, results_by_target_all(out)


def results_by_target_all(out: Path) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in json.loads((out / "results.json").read_text()):
        by.setdefault(r["cell_id"].split("[", 1)[0], []).append(r)
    return by


def _blob(r: dict[str, Any]) -> str:
    return r["message"] + "\n" + "\n".join(f["message"] + "\n" + f["traceback"]
                                           for f in r["failures"])


def _state_failure(r: dict[str, Any], check: str = "process_state") -> str:
    """The cell failed itself, check ``check`` (``process_state``: it changed what cannot
    be restored, the world is recycled; ``process_shared``: it broke what the world
    shares, it is not reused); the failure text."""
    assert r["status"] == "failed", r
    assert r["failures"][0]["check"] == check, r
    return _blob(r)


# ------------------------------------------------------------------ row 1: environment

@pytest.mark.slow
def test_every_cell_starts_with_the_rank_variables_of_its_own_size(slots, serial) -> None:
    """Row 1: on a reused group of world ranks 2-3 a cell reads RANK 0/1, WORLD_SIZE 2
    (the world rank was restored after the previous cell before this change)."""
    log, _, by = slots
    envs = by["s2_env_check"]
    assert [r["status"] for r in envs] == ["passed"] * 6, log
    on_23 = [r["evidence"] for r in envs if r["evidence"]["world_rank"] == 2]
    assert len(on_23) >= 2, "cells ran on world ranks 2-3"
    # The same process and the same group object: the group was reused, not re-made.
    assert len({(ev["pid"], ev["group"]) for ev in on_23}) == 1, on_23
    for ev in on_23:
        assert (ev["env_RANK"], ev["env_RANK@rank1"], ev["env_WORLD_SIZE"]) == ("0", "1", "2")
        assert (ev["env_LOCAL_RANK"], ev["env_GROUP_RANK"], ev["env_ROLE_WORLD_SIZE"]) == \
            ("0", "0", "2")
    assert serial[2]["i18_env_check"]["status"] == "passed"


# ----------------------------------------------------------------------- row 2: forks

@pytest.mark.slow
def test_a_forked_child_never_writes_the_ranks_outcome(serial) -> None:
    """Row 2: a child that returns out of the case fails the cell naming it (before: it
    wrote an ok outcome and the cell passed); a child's sys.exit(0) is its own business
    (before: recorded as the rank's error)."""
    _, out, by = serial
    returns = by["i09_fork_returns"]
    text = _state_failure(returns, "process_shared")
    child = (out / returns["out_dir"] / "rank0" / "child-pid").read_text()
    assert f"a forked child (pid {child}) of the case returned out of the case" in text
    assert "os._exit" in text
    assert "ValueError: the child's own error" in _state_failure(by["i10_fork_raises"],
                                                                     "process_shared")
    exit0 = by["i11_fork_sys_exit"]
    assert exit0["status"] == "passed" and exit0["evidence"]["child_exit"] == 0, exit0
    mp = by["i12_multiprocessing_fork"]
    assert mp["status"] == "passed" and mp["evidence"]["mp_exit"] == 0, mp


@pytest.mark.slow
def test_children_a_cell_leaves_are_ended_with_it(serial) -> None:
    _, out, by = serial
    assert by["i13_leave_children"]["status"] == "passed"
    left = json.loads((out / by["i13_leave_children"]["out_dir"] / "rank0" / "left.json")
                      .read_text())
    wait_for("the children to be gone", lambda: not any(pid_alive(p) for p in left),
             timeout=10)
    assert by["i14_no_children"]["status"] == "passed"
    assert by["i14_no_children"]["evidence"]["children"] == 0


# -------------------------------------------------------- row 3: folders, HOME, TMPDIR

@pytest.mark.slow
def test_a_cell_never_reads_a_file_its_neighbour_wrote(serial, slots) -> None:
    """Row 3: a reader that never wrote its checkpoint fails as it does alone, whether
    the writer ran before it (serial) or beside it (slots)."""
    _, _, by = serial
    assert by["i15_ckpt_writer"]["status"] == "passed"
    reader = by["i16_ckpt_reader"]
    assert reader["status"] == "failed" and "FileNotFoundError" in _blob(reader), reader
    log, out_slots, by_slots = slots
    (writer,), (beside,) = by_slots["s0_ckpt_writer"], by_slots["s1_ckpt_reader"]
    assert writer["status"] == "passed", log
    assert beside["status"] == "failed" and "FileNotFoundError" in _blob(beside), beside
    assert (out_slots / "meet" / "written").exists()
    world = next((out_slots / "worlds").glob("*/world.json"))
    placed = json.loads(world.read_text())["placement"][:2]
    assert set(placed[0]).isdisjoint(placed[1]), "writer and reader ran side by side"


@pytest.mark.slow
def test_the_working_folder_is_fresh_shared_and_kept_only_on_failure(serial) -> None:
    _, out, by = serial
    ev = by["i17_folders"]["evidence"]
    assert by["i17_folders"]["status"] == "passed", by["i17_folders"]
    for name in ("cwd", "home", "tmp"):
        assert ev[f"{name}_empty"] is True and ev[f"{name}_in_cell_folder"] is True, ev
    assert ev["distinct"] is True and ev["shared_with_rank0"] is True, ev
    # Removed after a pass; kept, and named in the report, after a failure.
    assert not (out / by["i15_ckpt_writer"]["out_dir"] / "work").exists()
    reader = by["i16_ckpt_reader"]
    (kept,) = [p for p in (out / reader["out_dir"] / "work").iterdir()]
    assert f"working folder kept: {kept.relative_to(out)}" in reader["message"]
    assert sorted(p.name for p in kept.iterdir()) == ["cwd", "home", "tmp"]


# ------------------------------------------------- rows 8, 12: process-wide settings

@pytest.mark.slow
def test_settings_a_cell_leaves_are_put_back_before_the_next(serial) -> None:
    """Rows 8 and 12 and the inventory: a function mode and a dispatch mode left entered,
    flush-denormal, default dtype, autocast, saved-tensor hooks, the recursion limit,
    numpy's error state, a signal handler, warnings filters, os.putenv, ..."""
    log, _, by = serial
    assert by["i00_leave_settings"]["status"] == "passed", log
    fingerprint = by["i01_settings_fingerprint"]
    assert fingerprint["status"] == "passed", _blob(fingerprint)
    mismatch = by["i02_half_mismatch_victim"]
    assert mismatch["status"] == "failed", mismatch
    assert "Mismatched elements: 2 / 4 (50.0%)" in _blob(mismatch)
    denormal = by["i03_denormal_victim"]
    assert denormal["status"] == "passed", _blob(denormal)
    assert denormal["evidence"]["denormal"] > 0


# ------------------------------------------------------------ row 9 and other patches

@pytest.mark.slow
def test_a_patch_on_cpmatrix_fails_the_patcher_and_not_the_next_cell(serial) -> None:
    """Row 9: the patcher fails; the next cell's 2x output error is seen."""
    _, _, by = serial
    assert "cpmatrix.parity.compare.compare_named" in _state_failure(by["i04_patch_parity"])
    victim = by["i05_parity_victim"]
    assert victim["status"] == "failed" and "2x output error" in _blob(victim), victim
    assert victim["attempts"] == 1


@pytest.mark.slow
def test_a_patch_on_an_installed_package_and_a_thread_left_fail_their_cell(serial) -> None:
    _, _, by = serial
    assert "numpy.allclose" in _state_failure(by["i06_patch_installed"])
    victim = by["i07_installed_victim"]
    assert victim["status"] == "failed" and "2x error (numpy.allclose)" in _blob(victim)
    assert "left-behind" in _state_failure(by["i08_leave_thread"])


# ------------------------------------------------------------------ rows 10, 11: groups

@pytest.mark.slow
def test_a_pending_send_fails_its_cell_and_the_next_gets_a_clean_group(serial) -> None:
    """Row 10: before, the culprit passed and the innocent next cell timed out."""
    _, _, by = serial
    text = _state_failure(by["i19_pending_isend"], "process_shared")
    assert "1 send(s) to rank 1 with tag 0" in text and "without a partner" in text
    victim = by["i20_p2p_victim"]
    assert victim["status"] == "passed", _blob(victim)
    assert victim["evidence"]["received@rank1"] == 6.0


@pytest.mark.slow
def test_a_destroyed_subgroup_fails_the_cell_that_destroyed_it(serial) -> None:
    """Row 11: before, the culprit passed and the next cell failed with "Could not
    resolve the process group"."""
    _, _, by = serial
    assert "mesh_cp0" in _state_failure(by["i21_destroy_subgroup"], "process_shared")
    assert by["i22_subgroup_victim"]["status"] == "passed", _blob(by["i22_subgroup_victim"])


@pytest.mark.slow
def test_groups_used_by_matched_collectives_stay_usable(serial) -> None:
    _, _, by = serial
    for target in ("i23_collectives_only", "i24_after_collectives"):
        assert by[target]["status"] == "passed", _blob(by[target])
        assert by[target]["attempts"] == 1
