"""Writes the synthetic reports here: ``python tests/resources/reports/make_synthetic.py``.

``green.xml`` passes every gate check; each other file differs from it in exactly one way
(named in its first comment), so a test that sees a check fail knows what caused it. The
XML has the shape ``cpmatrix run`` writes (see ``cpmatrix.report.junit``).
"""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent

R11 = "ring[unit,1x1,fp64,autocast=off,reference]@cpu"
R12 = "ring[unit,1x2,fp64,autocast=off,reference]@cpu"
R22 = "ring[unit,2x2,bf16,autocast=on,reference,seq=7]@cpu"
RCUDA = "ring[unit,2x2,fp64,autocast=off,kernel]@cuda"
SPILL = "softmax_spill[unit,1x1,fp32,autocast=off,kernel,block=1024]@cpu"
SCRATCH = "scratch[layer,1x2,fp32,autocast=off,reference]@cpu"

TRACEBACK = """--- rank 0: AssertionError: Tensor-likes are not close! [check: parity]
Traceback (most recent call last):
  File "cases/ring.py", line 40, in ring_case
    check_parity(cell, serial, cp, inputs=inputs)
AssertionError: Tensor-likes are not close!
Mismatched elements: 3 / 96 (3.1%) <html-like text & must be escaped>"""


def cell(cid: str, status: str, evidence: dict[str, str], *, tags: str = "release",
         mutant: str = "", extra: dict[str, str] | None = None) -> dict[str, object]:
    return {"id": cid, "status": status, "evidence": evidence, "tags": tags, "mutant": mutant,
            "extra": extra or {}}


def parity(max_abs: str, max_rel: str, atol: str = "1e-07", rtol: str = "1e-05") -> dict[str, str]:
    return {"parity.max_abs": max_abs, "parity.max_rel": max_rel, "parity.atol": atol,
            "parity.rtol": rtol, "parity.check.tolerance": "ok: fp64 table row"}


GREEN = [
    cell(R11, "passed", parity("1e-09", "2e-08")),
    # Ranks disagreed on one value: reported per rank, the gate takes the max.
    cell(R12, "cached", {**parity("0.0", "0.0"), "parity.max_abs@rank1": "0.0"}),
    cell(R22, "passed", parity("0.003", "0.004", atol="0.01", rtol="0.016")),
    cell(RCUDA, "passed", parity("2e-09", "3e-08")),
    cell(SPILL, "passed", {"spill_store_bytes": "0", "spill_load_bytes": "0", "budget_bytes": "0",
                           "registers": "29", "stack_bytes": "0"}),
    # Not tagged release: its failure is outside the release policy's scope.
    cell(SCRATCH, "failed", {}, tags="", extra={"kind": "error", "failing_ranks": "1"}),
    cell(R12, "passed", {"mutant_outcome": "killed", "killed_by": "parity"},
         mutant="no_allreduce"),
    cell(R12, "passed", {"mutant_outcome": "killed", "killed_by": "sharding_active"},
         mutant="skip_shard"),
]


def _replace(cid: str, mutant: str, **changes: object) -> Callable[[list[dict[str, object]]], None]:
    def edit(cells: list[dict[str, object]]) -> None:
        for c in cells:
            if c["id"] == cid and c["mutant"] == mutant:
                c.update(changes)

    return edit


def _drop(cid: str) -> Callable[[list[dict[str, object]]], None]:
    def edit(cells: list[dict[str, object]]) -> None:
        cells[:] = [c for c in cells if not (c["id"] == cid and not c["mutant"])]

    return edit


def _drift(cells: list[dict[str, object]]) -> None:
    # R11 still passes (5e-9 < atol 1e-7) but has 5x the baseline's error; R12 goes
    # 0 -> 1e-16 (under the floor: not drift); R22 3e-3 -> 4e-3 (x1.33: within x2).
    _replace(R11, "", evidence=parity("5e-09", "2e-08"))(cells)
    _replace(R12, "", evidence={**parity("1e-16", "1e-16"), "parity.max_abs@rank1": "0.0"})(cells)
    _replace(R22, "", evidence=parity("0.004", "0.004", atol="0.01", rtol="0.016"))(cells)


#: file -> (what differs from green.xml, the edit)
VARIANTS: dict[str, tuple[str, Callable[[list[dict[str, object]]], None]]] = {
    "failed.xml": (f"{R11} failed", _replace(
        R11, "", status="failed", extra={"kind": "error", "failing_ranks": "0,1"})),
    "skipped.xml": (f"{R12} skipped", _replace(R12, "", status="skipped")),
    "flaky.xml": (f"{R11} flaky (passed on retry)", _replace(
        R11, "", status="flaky", extra={
            "attempts": "2", "message": "passed on retry after: crash (crash) on rank 1"})),
    "missing.xml": (f"{R22} is not in the report", _drop(R22)),
    "spill.xml": (f"{SPILL} spills 7420/9508 bytes over a 0-byte budget (status still passed)",
                  _replace(SPILL, "", evidence={
                      "spill_store_bytes": "7420", "spill_load_bytes": "9508",
                      "budget_bytes": "0", "registers": "255", "stack_bytes": "3816"})),
    "survivor.xml": (f"{R12}!mutant=skip_shard survived", _replace(
        R12, "skip_shard", status="failed", evidence={"mutant_outcome": "survived"},
        extra={"kind": "error", "message": "mutant 'skip_shard' survived: the cell passed "
               "with this bug planted, so the test is vacuous for it"})),
    "drift.xml": (f"{R11} max_abs 1e-9 -> 5e-9 (x5, still under atol)", _drift),
}


def _testcase(c: dict[str, object]) -> ET.Element:
    cid, status, mutant = str(c["id"]), str(c["status"]), str(c["mutant"])
    name = f"{cid}!mutant={mutant}" if mutant else cid
    target = cid.split("[", 1)[0]
    tc = ET.Element("testcase", name=name, classname=target, time="0.250")
    props = ET.SubElement(tc, "properties")
    body = cid.split("[", 1)[1].split("]", 1)[0].split(",")
    values = {"cell_id": cid, "target": target, "platform": cid.rsplit("@", 1)[1],
              "mesh": body[1], "dtype": body[2], "autocast": body[3].split("=")[1],
              "path": body[4], "level": body[0], "params": ",".join(body[5:]),
              "tags": str(c["tags"]), "status": status, "duration": "0.250",
              "attempts": "1"}
    values.update(c["extra"])  # type: ignore[arg-type]
    if mutant:
        values["mutant"] = mutant
    for key, value in values.items():
        ET.SubElement(props, "property", name=key, value=value)
    for key, value in c["evidence"].items():  # type: ignore[attr-defined]
        ET.SubElement(props, "property", name=f"evidence.{key}", value=value)
    if status in ("failed", "crash", "timeout"):
        if status == "failed" and not mutant:
            ranks = values.get("failing_ranks", "0")
            failure = ET.SubElement(tc, "failure", type="AssertionError", message=(
                f"failed (error) on rank {ranks}: AssertionError: Tensor-likes are not close!"))
            failure.text = TRACEBACK
        elif mutant:
            ET.SubElement(tc, "failure", type="error", message="failed (error) on rank ?: "
                          + values.get("message", ""))
    elif status == "skipped":
        ET.SubElement(tc, "skipped", message="needs 4 GPUs")
    elif status == "flaky":
        out = ET.SubElement(tc, "system-out")
        out.text = "FLAKY: passed on retry after: crash (crash) on rank 1: rank 1 died"
    return tc


def write(path: Path, cells: list[dict[str, object]], comment: str) -> None:
    root = ET.Element("testsuites", name="cpmatrix")
    suites: dict[str, ET.Element] = {}
    for c in cells:
        target = str(c["id"]).split("[", 1)[0]
        if target not in suites:
            suites[target] = ET.SubElement(root, "testsuite", name=target)
        suites[target].append(_testcase(c))
    ET.indent(root)
    text = ET.tostring(root, encoding="unicode")
    path.write_text(f"<!-- {comment} (generated by make_synthetic.py) -->\n{text}\n")


def main() -> None:
    write(HERE / "green.xml", GREEN, "passes every check of the release policy")
    for name, (what, edit) in VARIANTS.items():
        cells = copy.deepcopy(GREEN)
        edit(cells)
        write(HERE / name, cells, f"green.xml except: {what}")


if __name__ == "__main__":
    main()
