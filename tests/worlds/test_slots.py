"""Cells at once on disjoint ranks of one world (tests/resources/slots.yaml, gloo).

The ``meet`` cells pass only when their partner runs at the same time (so the first test
fails with ``--pack serial``: shown by the second). Each fault (crash, hang, error,
unrestorable state) runs beside an innocent ``neighbour`` it has met: the fault blames
only its own cell, and the neighbour passes, at its first attempt, rerun in a fresh world
where the fault took its world down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_runner import RES, results_by_target, run_cli

MATRIX = str(RES / "slots.yaml")
ROOT = Path(__file__).parents[2]


def run_slots(out: Path, select: str, *extra: str) -> tuple[int, str, dict[str, dict[str, Any]]]:
    proc = run_cli("run", "--matrix", MATRIX, "-k", select, "--out", str(out), "--plain",
                   "--no-cache", *extra)
    log = proc.stdout + proc.stderr
    return proc.returncode, log, results_by_target(out)


def world_files(out: Path) -> list[dict[str, Any]]:
    """Each world launch's job file, in launch order."""
    return [json.loads((p / "world.json").read_text())
            for p in sorted((out / "worlds").iterdir()) if (p / "world.json").exists()]


def launches_of(out: Path, target: str) -> int:
    return sum(any(c["target"] == target for c in w["cells"]) for w in world_files(out))


def started(out: Path, target: str) -> int:
    """World launches in which some rank started ``target``'s cell."""
    count = 0
    for p in sorted((out / "worlds").iterdir()):
        if not (p / "world.json").exists():
            continue
        cells = json.loads((p / "world.json").read_text())["cells"]
        index = [i for i, c in enumerate(cells) if c["target"] == target]
        if index and any((p / "progress").glob(f"{index[0]}.r*.start")):
            count += 1
    return count


@pytest.mark.slow
def test_cells_run_at_once_on_disjoint_ranks_each_in_a_group_of_its_own(
        tmp_path: Path) -> None:
    code, log, by = run_slots(tmp_path / "out", "wide or meet")
    assert code == 0, log
    assert "(1 planned world, 1 world start)" in log
    a, b = by["meet_a"]["evidence"], by["meet_b"]["evidence"]
    # Each ran in a group of exactly its two ranks, on other world ranks than the other.
    for ev in (a, b):
        assert (ev["dist_world_size"], ev["env_world_size"], ev["flat_sum"]) == (2, 2, 2.0)
        assert ev["env_rank"] == 0  # rank 0 of the cell records, whatever its world rank
    assert {a["world_rank"], b["world_rank"]} == {0, 2}
    assert by["wide"]["evidence"]["dist_world_size"] == 4
    (world,) = world_files(tmp_path / "out")
    placed = {c["target"]: tuple(r) for c, r in zip(world["cells"], world["placement"],
                                                    strict=True)}
    assert set(placed["meet_a"]).isdisjoint(placed["meet_b"])


@pytest.mark.slow
def test_one_cell_at_a_time_the_meet_cells_fail(tmp_path: Path) -> None:
    """The control for the test above: without slots the partner never runs at once."""
    code, log, by = run_slots(tmp_path / "out", "wide or meet", "--pack", "serial")
    assert code == 1, log
    first = [by[t] for t in ("meet_a", "meet_b") if by[t]["status"] != "passed"]
    assert first and "did not run at the same time" in json.dumps(first[0]["failures"])


FAULTS = {
    # fault target: (status, failing ranks, text in its failures)
    "crash_beside": ("crash", [1], "exited with code 13"),
    "hang_beside": ("timeout", [0, 1], "still in the cell"),  # rank 1 waits for rank 0
    "error_beside": ("failed", [0], "planted error beside another cell"),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_blames_only_its_cell_never_the_cell_beside_it(
        fault: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, log, by = run_slots(out, f"{fault} or neighbour", "--world-ranks", "4",
                              "--abort-grace", "2")
    assert code == 1, log
    status, ranks, text = FAULTS[fault]
    r = by[fault]
    assert (r["status"], r["failing_ranks"]) == (status, ranks), r
    assert text in json.dumps(r["failures"]), r
    n = by["neighbour"]
    assert (n["status"], n["attempts"]) == ("passed", 1), n
    # They did run side by side: the neighbour met the fault (it fails otherwise).
    assert (out / "meet" / fault.removesuffix("_beside")).exists()
    (first, *_) = world_files(out)
    placed = dict(zip((c["target"] for c in first["cells"]), first["placement"],
                      strict=True))
    assert set(placed[fault]).isdisjoint(placed["neighbour"])
    # The neighbour was still running when the fault took the world down (it sleeps past
    # the hang's timeout and the abort grace): started there, and again in a fresh world.
    assert started(out, "neighbour") == 2


@pytest.mark.slow
def test_unrestorable_state_retires_its_ranks_and_the_next_cell_there_reruns(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, log, by = run_slots(out, "patch_beside or neighbour or genuine",
                              "--world-ranks", "4")
    assert code == 1, log
    patch = by["patch_beside"]
    assert (patch["status"], patch["failures"][0].get("check", "")) != ("passed", ""), patch
    assert "process_state" in json.dumps(patch), patch
    assert (by["neighbour"]["status"], by["neighbour"]["attempts"]) == ("passed", 1)
    # genuine was placed on a patched rank after patch_beside: skipped there (never
    # started), rerun in a fresh world where assert_close is torch's own.
    g = by["genuine"]
    assert (g["status"], g["attempts"]) == ("passed", 1), g
    (first, *_) = world_files(out)
    placed = dict(zip((c["target"] for c in first["cells"]), first["placement"],
                      strict=True))
    assert set(placed["genuine"]) <= set(placed["patch_beside"])
    assert launches_of(out, "genuine") == 2 and started(out, "genuine") == 1


@pytest.mark.slow
def test_a_rank_dying_after_its_last_cell_fails_no_cell(tmp_path: Path) -> None:
    """A rank that dies once it ran out of cells (here at interpreter exit, as a crash in
    a communicator's teardown would) blames no cell; what ran beside it reruns.

    torchrun: its ranks are whole interpreters that run ``atexit`` handlers; the fork
    launcher's ranks end with ``os._exit`` (as multiprocessing's do), so none runs there.
    The supervisor's decision is the same for both launchers."""
    out = tmp_path / "out"
    code, log, by = run_slots(out, "die_after_last_cell or slow", "--world-ranks", "3",
                              "--launcher", "torchrun")
    assert code == 0, log
    assert (out / "died-once").exists()  # it did die: exit code 7 after its cell
    assert "exitcode  : 7" in (sorted((out / "worlds").glob("*.a1"))[0]
                               / "torchrun.log").read_text()
    for target in ("die_after_last_cell", "slow"):
        assert (by[target]["status"], by[target]["attempts"]) == ("passed", 1), by[target]
    # slow was running beside it when the world went down: it ran again, in a fresh world.
    assert started(out, "slow") == 2


@pytest.mark.slow
def test_the_report_is_the_same_with_slots_as_one_cell_at_a_time(tmp_path: Path) -> None:
    """Real parity cells of 1-9 ranks (fp64): the same verdicts and the same evidence,
    value for value, whether they ran side by side or one at a time."""
    select = "fp64 and (ring_attention or layernorm or collectives)"
    runs = {}
    for pack in ("slots", "serial"):
        out = tmp_path / pack
        proc = run_cli("run", "--matrix", str(ROOT / "matrix" / "parity.yaml"), "--platform",
                       "cpu", "-k", select, "--pack", pack, "--out", str(out), "--plain",
                       "--no-cache")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[pack] = {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}
    slots, serial = runs["slots"], runs["serial"]
    assert len(slots) == 29 and slots.keys() == serial.keys()
    for cell_id, r in slots.items():
        assert r["status"] == serial[cell_id]["status"] == "passed", cell_id
        assert r["evidence"] == serial[cell_id]["evidence"], cell_id
    plan = json.loads(next((tmp_path / "slots" / "worlds").glob("*/world.json")).read_text())
    starts = {}
    for path in (tmp_path / "slots" / "worlds").glob("*/progress/*.r0.start"):
        starts[int(path.name.split(".")[0])] = json.loads(path.read_text())["time"]
    dones = {}
    for path in (tmp_path / "slots" / "worlds").glob("*/progress/*.r0.done"):
        dones[int(path.name.split(".")[0])] = json.loads(path.read_text())["end_time"]
    # Some cells did run at the same time (on disjoint ranks, as placed).
    overlapping = [(i, j) for i in starts for j in starts if i < j
                   and starts[i] < dones[j] and starts[j] < dones[i]]
    assert overlapping
    for i, j in overlapping:
        assert set(plan["placement"][i]).isdisjoint(plan["placement"][j])
