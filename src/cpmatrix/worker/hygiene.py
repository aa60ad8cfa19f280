"""Communication hygiene: every group a cell touched is drained and usable, or not reused.

A rank keeps its process groups from cell to cell (a gloo group costs 10-300 ms to make,
a mesh 20-60 ms), so a cell could leave something in a group that reaches the next
cell: an unmatched ``isend`` (matched by the next cell's ``recv``), a collective only
some ranks issued (every later collective out of step), a group it destroyed, a group
in error. After each cell every rank reports what it did to each group
(:class:`GroupLedger`), the cell's ranks exchange the reports through the store with their
outcomes, and each takes the same decision from them (:func:`judge`):

- a group nobody used during the cell is left as it was;
- a group used by collectives only, the same number on every member, is **probed**: a
  barrier on it (gloo's barrier waits for every earlier operation of the group) proves
  it drained and usable; a group whose probe fails is in error: the cell fails and the
  group is not reused;
- a group that carried point-to-point operations is **not reused** (destroyed, made
  afresh for the next cell that needs it): no API of torch 2.13 says whether a send or
  receive is still outstanding on a gloo group. When the sends and receives the ranks
  report do not pair up (a send to rank 1 with tag 5 that rank 1 never received), the
  cell fails too;
- a collective count that differs between members, or a group the cell destroyed (the
  default group, a mesh dimension's), fails the cell with check ``process_state``;
- groups the case made itself are destroyed after the cell, never reused.

What torch offers, as of 2.13, and why the ledger counts point-to-point operations
itself: ``ProcessGroup._get_sequence_number_for_group`` counts every operation a gloo
group issued, collectives and point-to-point alike (nccl's counts collectives only); the
flight recorder's ``pg_status`` holds the sequence number of a group's last collective
(not a count), and its entries (collectives only on gloo) cost about a second to dump
at its default 2,000 entries. So :func:`install_p2p_counter` wraps the point-to-point
methods of torch's ``ProcessGroup`` and backend classes (``send``, ``recv``,
``recv_anysource``: every ``dist.send/recv/isend/irecv/batch_isend_irecv/P2POp`` goes
through them) with a counter of (peer, tag) per group: one Python call per operation.
The wrappers are in place before the first cell, so the namespace watch
(:mod:`cpmatrix.worker.namespaces`) holds them as torch's own.

Imports only the standard library at import time; torch is imported by the ledger.

Example (the decision, from two ranks' reports)::

    >>> used = {"ranks": [0, 1], "ops": 2, "desc": "mesh_cp1"}
    >>> v = judge({0: {"groups": {"3": used}}, 1: {"groups": {"3": used}}})
    >>> v.probe, sorted(v.drop), v.blame
    (['3'], [], {})
    >>> sent = dict(used, p2p=[["s", 1, 0, 1]])
    >>> v = judge({0: {"groups": {"3": sent}}, 1: {"groups": {"3": used}}})
    >>> v.probe, sorted(v.drop), list(v.blame)
    ([], ['3'], [0])
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GroupLedger", "Verdict", "install_p2p_counter", "judge"]

#: Per group object (by id), the point-to-point operations issued: (kind, peer, tag).
_P2P: dict[int, Counter[tuple[str, int, int]]] = {}


def _peer_tag(kind: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """(peer, tag) of a ``send(tensors, dstRank, tag)``, ``recv(tensors, srcRank, tag)``
    or ``recv_anysource(tensors, tag)`` call (peer -1: any)."""
    if kind == "a":
        return -1, int(args[1] if len(args) > 1 else kwargs.get("tag", 0))
    peer = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank", -1))
    return int(peer), int(args[2] if len(args) > 2 else kwargs.get("tag", 0))


def _counting(method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            peer, tag = _peer_tag(kind, args, kwargs)
        except (TypeError, ValueError):  # a call torch itself will reject
            peer, tag = -2, -1
        counter = _P2P.setdefault(id(self), Counter())
        counter["r" if kind == "a" else kind, peer, tag] += 1
        return method(self, *args, **kwargs)

    counted.__name__ = counted.__qualname__ = getattr(method, "__name__", kind)
    counted.__doc__ = getattr(method, "__doc__", None)
    counted.__wrapped__ = method  # type: ignore[attr-defined]
    counted._cpmatrix_p2p_counter = True  # type: ignore[attr-defined]
    return counted


def install_p2p_counter() -> bool:
    """Count every ``send``/``recv``/``recv_anysource`` of every process group (idempotent);
    False where torch has no such methods to wrap."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return False
    classes = [getattr(c10d, name, None) for name in ("ProcessGroup", "Backend")]
    done = False
    for cls in classes:
        if cls is None:
            continue
        for name, kind in (("send", "s"), ("recv", "r"), ("recv_anysource", "a")):
            method = vars(cls).get(name)
            if method is None or getattr(method, "_cpmatrix_p2p_counter", False):
                done = done or method is not None
                continue
            setattr(cls, name, _counting(method, kind))
            done = True
    return done


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the cell's ranks do with the groups the cell touched (the same on each)."""

    #: Group names to probe with a barrier (in this order on every member).
    probe: list[str] = field(default_factory=list)
    #: Group names never to reuse (destroyed after the cell, made afresh when needed).
    drop: set[str] = field(default_factory=set)
    #: Cell rank -> why the cell fails (check ``process_state``).
    blame: dict[int, list[str]] = field(default_factory=dict)


def _desc(entry: Mapping[str, Any], name: str) -> str:
    desc = str(entry.get("desc") or "")
    return f"{desc} (group {name})" if desc else f"group {name}"


def _unmatched(name: str, entry: Mapping[str, Any],
               p2p: Mapping[int, list[list[Any]]]) -> dict[int, str]:
    """Cell rank -> its sends/receives on group ``name`` that no peer's op pairs with."""
    sends: Counter[tuple[int, int, int]] = Counter()
    recvs: Counter[tuple[int, int, int]] = Counter()
    anys: Counter[tuple[int, int]] = Counter()
    for rank, ops in p2p.items():
        for kind, peer, tag, n in ops:
            if kind == "s":
                sends[(rank, int(peer), int(tag))] += int(n)
            elif int(peer) >= 0:
                recvs[(int(peer), rank, int(tag))] += int(n)
            else:  # recv_anysource
                anys[(rank, int(tag))] += int(n)
    left_sends = sends - recvs
    left_recvs = recvs - sends
    for (src, dst, tag), n in list(left_sends.items()):  # receives from any source
        take = min(n, anys[(dst, tag)])
        anys[(dst, tag)] -= take
        left_sends[(src, dst, tag)] -= take
    left_sends += Counter()  # drop the zeros
    blamed: dict[int, list[str]] = {}
    for (src, dst, tag), n in left_sends.items():
        blamed.setdefault(src, []).append(f"{n} send(s) to rank {dst} with tag {tag}")
    for (src, dst, tag), n in left_recvs.items():
        blamed.setdefault(dst, []).append(f"{n} receive(s) from rank {src} with tag {tag}")
    for (dst, tag), n in anys.items():
        if n > 0:
            blamed.setdefault(dst, []).append(f"{n} receive(s) from any rank with tag {tag}")
    where = _desc(entry, name)
    return {rank: (f"the cell left {', '.join(what)} on {where} without a partner: a "
                   "pending send or receive would be matched by the next cell's")
            for rank, what in blamed.items()}


def judge(reports: Mapping[int, Mapping[str, Any]]) -> Verdict:
    """The decision every rank of a cell takes from the same reports (cell rank -> the
    rank's :meth:`GroupLedger.after_case` report). Pure: no torch, no processes."""
    groups: dict[str, dict[str, Any]] = {}
    ops: dict[str, dict[int, int]] = {}
    p2p: dict[str, dict[int, list[list[Any]]]] = {}
    drop: set[str] = set()
    blame: dict[int, list[str]] = {}
    unknown = False
    for rank, report in reports.items():
        unknown = unknown or bool(report.get("unknown"))
        for name, entry in report.get("groups", {}).items():
            known = groups.setdefault(name, dict(entry))
            if list(known.get("ranks", [])) != list(entry.get("ranks", [])):
                drop.add(name)  # the ranks disagree about what the name means
            ops.setdefault(name, {})[rank] = int(entry.get("ops", 0))
            if entry.get("p2p"):
                p2p.setdefault(name, {})[rank] = list(entry["p2p"])
        drop.update(report.get("created", []))
    used = {name for name, by_rank in ops.items() if any(by_rank.values())} | set(p2p)
    if unknown:
        # What a rank did cannot be accounted for (a group it held was destroyed, or
        # the counter could not be installed): nothing it used is reused.
        return Verdict(drop=drop | used, blame=blame)
    probe = []
    for name in sorted(used):
        if name in p2p:
            for rank, why in _unmatched(name, groups[name], p2p[name]).items():
                blame.setdefault(rank, []).append(why)
            drop.add(name)  # sends and receives cannot be proven drained: not reused
            continue
        if name in drop:
            continue
        members = [int(r) for r in groups[name].get("ranks", [])]
        issued = {r: ops[name].get(r, 0) for r in members}
        if len(set(issued.values())) > 1:
            shown = ", ".join(f"rank {r}: {n}" for r, n in sorted(issued.items()))
            why = (f"the ranks issued different numbers of collectives on "
                   f"{_desc(groups[name], name)} ({shown}): one was left unmatched, and "
                   "every later collective on the group would be out of step")
            least = min(issued.values())
            for rank in members:  # those that issued what the others did not
                if rank in reports and issued[rank] > least:
                    blame.setdefault(rank, []).append(why)
            drop.add(name)
        else:
            probe.append(name)
    return Verdict(probe=probe, drop=drop, blame=blame)


class GroupLedger:
    """What one rank's cell did to its process groups (snapshot before the case)."""

    def __init__(self) -> None:
        #: Whether point-to-point operations are counted (else used groups are dropped).
        self.counting = install_p2p_counter()
        self._seq: dict[Any, int] = {}
        self._names: dict[Any, tuple[str, str]] = {}
        #: Whether :meth:`before_case` ran for the current cell (the case ran).
        self.armed = False

    @staticmethod
    def _groups() -> dict[Any, tuple[str, str]]:
        """Every live group of this process -> (name, description)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return {}
        world: Any = dist.distributed_c10d._world
        return {pg: (str(name), str(getattr(pg, "group_desc", "") or ""))
                for pg, name in list(world.pg_names.items())}

    def disarm(self) -> None:
        """A new cell: nothing to report until its case is about to run."""
        self.armed = False

    def before_case(self) -> None:
        self.armed = True
        self._names = self._groups()
        self._seq = {pg: int(pg._get_sequence_number_for_group()) for pg in self._names}
        _P2P.clear()

    def after_case(self) -> tuple[dict[str, Any], list[str]]:
        """(this rank's report for :func:`judge`, the groups the case destroyed)."""
        import torch.distributed as dist

        if not self.armed:  # the case never ran (its mesh or module failed): no use
            return {"groups": {}, "created": []}, []
        self.armed = False
        now = self._groups()
        destroyed = [f"{desc or 'group'} ({name})" for pg, (name, desc) in self._names.items()
                     if pg not in now]
        groups: dict[str, dict[str, Any]] = {}
        created: list[str] = []
        for pg, (name, desc) in now.items():
            try:
                seq = int(pg._get_sequence_number_for_group())
                ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
            except Exception:
                continue  # a group this rank is not a member of
            ops = seq - self._seq.get(pg, 0)
            if pg not in self._seq:
                created.append(name)
            sent = _P2P.get(id(pg))
            entry: dict[str, Any] = {"ranks": ranks, "ops": ops, "desc": desc}
            if sent:  # a peer is a rank of the group: named by its rank in the cell
                entry["p2p"] = [[kind, ranks[peer] if 0 <= peer < len(ranks) else peer,
                                 tag, n] for (kind, peer, tag), n in sorted(sent.items())]
            if ops or sent or pg not in self._seq:
                groups[name] = entry
        report = {"groups": groups, "created": created,
                  "unknown": bool(destroyed) or not self.counting}
        _P2P.clear()
        return report, destroyed

    def probe(self, names: list[str], my_rank: int, timeout_s: float) -> list[str]:
        """Barrier on each group in ``names`` this rank belongs to (all at once, in the
        same order on every member); the failures, described."""
        import torch.distributed as dist

        by_name = {name: (pg, desc) for pg, (name, desc) in self._groups().items()}
        works = []
        problems = []
        opts: Any = dist.BarrierOptions()
        opts.timeout = datetime.timedelta(seconds=timeout_s)
        for name in names:
            pg, desc = by_name.get(name, (None, ""))
            if pg is None:
                continue
            try:
                if my_rank not in dist.get_process_group_ranks(pg):
                    continue
                works.append((name, desc, pg.barrier(opts)))
            except Exception as exc:
                problems.append(f"{desc or 'group'} ({name}) is in error after the cell: "
                                f"{type(exc).__name__}: {exc}")
        for name, desc, work in works:
            try:
                work.wait()
            except Exception as exc:
                problems.append(f"{desc or 'group'} ({name}) is in error after the cell: "
                                f"{type(exc).__name__}: {exc}")
        return problems
