"""Cutting a cell (cpmatrix.worker.sever) on real loopback connections and a real store."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist

from cpmatrix.worker import sever


def _pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname()[:2])
    server, _ = listener.accept()
    return client, server


@pytest.fixture
def armed() -> Iterator[Any]:
    store = dist.HashStore()  # type: ignore[attr-defined]  # public, not in the stubs
    yield store
    sever.disarm()


def test_a_cut_closes_this_processs_connections_but_the_stores(armed: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as store_side, \
            socket.create_server(("127.0.0.1", 0)) as group_side:
        to_store, store_peer = _pair(store_side)
        to_peer, peer = _pair(group_side)
        sever.arm(armed, index=3, rank=1, size=2, store_port=store_side.getsockname()[1])
        assert not sever.was_cut(armed, 3, 2)
        assert sever.cut_peers() >= 2  # both ends of the group's pair live in this process
        peer.settimeout(5)
        assert peer.recv(1) == b""  # the peer sees the connection closed, at once
        to_store.sendall(b"x")
        store_peer.settimeout(5)
        assert store_peer.recv(1) == b"x"  # the store's connection is untouched
        assert sever.was_cut(armed, 3, 2)
        sever.arm(armed, index=3, rank=0, size=2, store_port=0)
        assert sever.cut_by_peer()  # rank 0 sees rank 1's word
        for s in (to_store, store_peer, to_peer, peer):
            s.close()


def test_a_connection_gone_meanwhile_is_no_error(armed: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # gloo closes a pair's fd in its own thread when the peer cut first: between the
    # listing of /proc and the shutdown the fd may be gone.
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    monkeypatch.setattr(sever, "_connections", lambda exclude_port: [r])
    sever.arm(armed, index=0, rank=0, size=2, store_port=0)
    assert sever.cut_peers() == 0


def test_nothing_is_cut_when_not_armed_or_alone(armed: Any) -> None:
    assert sever.cut_peers() == 0 and not sever.cut_by_peer()
    sever.arm(armed, index=0, rank=0, size=1, store_port=0)
    assert sever.cut_peers() == 0 and not sever.was_cut(armed, 0, 1)


def test_peers_done_waits_for_every_peers_word(armed: Any) -> None:
    sever.arm(armed, index=2, rank=0, size=2, store_port=0)
    sever.done()
    assert not sever.peers_done(0.05)
    armed.set(sever.done_key(2, 1), "1")
    assert sever.peers_done(0.05)
