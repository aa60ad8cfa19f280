"""The decision a cell's ranks take about the groups the cell used (remote/hygiene.py).

Pure: the reports are what each rank's ledger writes; the worlds that produce them are in
tests/worlds/test_isolation.py. Also the point-to-point counter on a real gloo group of
one process (no world needed).
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from cpmatrix.remote.hygiene import GroupLedger, install_p2p_counter, judge


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


def _rank(rank: int, path: str) -> dict[str, Any]:
    """Rank ``rank`` of a 2-rank gloo world: isend/recv with tag 4 both ways through
    torch's public API, then one collective; its ledger report."""
    import torch
    import torch.distributed as dist

    install_p2p_counter()
    dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        ledger = GroupLedger()
        ledger.before_case()
        t, got = torch.ones(2), torch.zeros(2)
        work = dist.isend(t, 1 - rank, tag=4)
        dist.recv(got, 1 - rank, tag=4)
        work.wait()
        dist.all_reduce(t)
        report, destroyed = ledger.after_case()
        assert destroyed == []
        return report
    finally:
        dist.destroy_process_group()


def test_the_counter_sees_every_send_and_receive_of_a_real_group(tmp_path: Any) -> None:
    """Two processes (this one and a fork), a real gloo group: what each rank issued."""
    import json
    import os

    assert install_p2p_counter() and install_p2p_counter()  # idempotent
    path = str(tmp_path / "store")
    child = os.fork()
    if child == 0:  # rank 1
        code = 1
        try:
            (tmp_path / "r1.json").write_text(json.dumps(_rank(1, path)))
            code = 0
        finally:
            os._exit(code)
    mine = _rank(0, path)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    theirs = json.loads((tmp_path / "r1.json").read_text())
    for report, peer in ((mine, 1), (theirs, 0)):
        (entry,) = report["groups"].values()
        assert entry["ops"] == 3  # the sequence number counts all three
        assert entry["p2p"] == [["r", peer, 4, 1], ["s", peer, 4, 1]]
    v = judge({0: mine, 1: theirs})
    assert v.blame == {} and v.drop == set(mine["groups"]) and v.probe == []
