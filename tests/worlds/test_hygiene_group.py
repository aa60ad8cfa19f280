"""The point-to-point counter of worker/hygiene.py on a real gloo group: two processes
(this one and a fork), no cpmatrix world around them. The decision it feeds is tested
pure in tests/unit/test_hygiene.py."""

from __future__ import annotations

import datetime
from typing import Any

from cpmatrix.worker.hygiene import GroupLedger, install_p2p_counter, judge


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
