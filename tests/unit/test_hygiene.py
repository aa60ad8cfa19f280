"""The decision a cell's ranks take about the groups the cell used (worker/hygiene.py).

Pure: the reports are what each rank's ledger writes; the worlds that produce them are in
tests/worlds/test_isolation.py, the point-to-point counter on a real two-process gloo
group in tests/worlds/test_hygiene_group.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from cpmatrix.worker.hygiene import judge


def group(ops: int, ranks: tuple[int, ...] = (0, 1), p2p: list[list[Any]] | None = None,
          desc: str = "mesh_cp1") -> dict[str, Any]:
    entry: dict[str, Any] = {"ranks": list(ranks), "ops": ops, "desc": desc}
    if p2p:
        entry["p2p"] = p2p
    return entry


def reports(*per_rank: dict[str, Any], created: tuple[str, ...] = ()) -> dict[int, Any]:
    return {r: {"groups": groups, "created": list(created)} for r, groups in
            enumerate(per_rank)}


def test_an_unused_group_is_neither_probed_nor_dropped() -> None:
    v = judge(reports({}, {}))
    assert (v.probe, v.drop, v.blame) == ([], set(), {})


def test_matched_collectives_are_probed_before_reuse() -> None:
    v = judge(reports({"3": group(4)}, {"3": group(4)}))
    assert (v.probe, v.drop, v.blame) == (["3"], set(), {})


def test_a_collective_only_some_ranks_issued_blames_them_and_drops_the_group() -> None:
    v = judge(reports({"3": group(5)}, {"3": group(4)}))
    assert v.probe == [] and v.drop == {"3"}
    assert list(v.blame) == [0]
    assert "rank 0: 5, rank 1: 4" in v.blame[0][0] and "mesh_cp1" in v.blame[0][0]


def test_a_rank_that_did_nothing_on_a_group_others_used_counts_as_zero() -> None:
    v = judge(reports({"3": group(1)}, {}))
    assert v.drop == {"3"} and list(v.blame) == [0]


@pytest.mark.parametrize(("ops0", "ops1", "blamed"), [
    # matched: a send and its receive; dropped all the same (cannot be proven drained)
    ([["s", 1, 0, 1]], [["r", 0, 0, 1]], []),
    # a send nobody received
    ([["s", 1, 0, 1]], [], [0]),
    # both posted, tags differ: both pending
    ([["s", 1, 5, 1]], [["r", 0, 7, 1]], [0, 1]),
    # a receive from any rank takes the send
    ([["s", 1, 3, 2]], [["r", -1, 3, 2]], []),
    # a receive nobody sent to
    ([], [["r", 0, 0, 1]], [1]),
])
def test_point_to_point_never_reuses_the_group_and_unmatched_ops_blame_their_rank(
        ops0: list[list[Any]], ops1: list[list[Any]], blamed: list[int]) -> None:
    v = judge(reports({"0": group(len(ops0), p2p=ops0)}, {"0": group(len(ops1), p2p=ops1)}))
    assert v.probe == [] and v.drop == {"0"}
    assert sorted(v.blame) == blamed
    for rank in blamed:
        assert "without a partner" in v.blame[rank][0]


def test_groups_the_case_made_are_dropped() -> None:
    v = judge(reports({"7": group(0)}, {"7": group(0)}, created=("7",)))
    assert v.drop == {"7"} and v.probe == []


def test_ranks_that_disagree_about_a_name_drop_it() -> None:
    v = judge(reports({"3": group(1, ranks=(0, 1))}, {"3": group(1, ranks=(0, 2))}))
    assert "3" in v.drop and "3" not in v.probe


def test_what_a_rank_cannot_account_for_drops_everything_used() -> None:
    r = reports({"3": group(2)}, {"3": group(2)})
    r[1]["unknown"] = True
    v = judge(r)
    assert v.drop == {"3"} and v.probe == [] and v.blame == {}
