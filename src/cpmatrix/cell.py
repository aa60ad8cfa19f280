"""What a case receives: :class:`CellContext`, the public case contract.

A case is a plain function ``def case(cell: CellContext) -> None`` named by a target
as ``module:function``. It runs on every rank of a world of ``cell.world_size``
ranks and fails by raising. Everything it needs is on ``cell``.

Example (a complete case)::

    import torch
    import torch.distributed as dist

    def allreduce_sum(cell):
        x = torch.randn(4, generator=cell.generator, dtype=cell.dtype)  # same on all ranks
        y = x.clone()
        dist.all_reduce(y, group=cell.mesh.get_group("cp1"))
        torch.testing.assert_close(y, x * cell.mesh.size(1))
        cell.record("max_abs_err", float((y - x * cell.mesh.size(1)).abs().max()))

This module imports only the standard library at import time; torch objects are
created by the worker and handed in.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

__all__ = ["MESH_DIMS", "TORCH_DTYPES", "CellContext", "CellFields", "EvidenceValue", "seed_for"]

EvidenceValue = int | float | str | bool

#: The names of a cell's mesh dims: ``cell.mesh["cp0"]`` (rows), ``cell.mesh["cp1"]`` (cols).
MESH_DIMS: Final = ("cp0", "cp1")
#: The dtype axis' values and the ``torch`` dtype each names (the one table of them).
TORCH_DTYPES: Final = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16",
                       "fp16": "float16"}

#: Longest string accepted by ``record``: evidence is numbers or short notes.
MAX_EVIDENCE_CHARS = 2000


def seed_for(cell_id: str, run_number: int = 1) -> int:
    """The cell's seed: derived from its id (and, past the first, its run number) only, so
    a repro draws the same numbers. Run 1 keeps the id's own seed: ``--runs-per-test 1``
    draws what a plain run draws.

    >>> seed_for("t@cpu") == seed_for("t@cpu", 1) != seed_for("t@cpu", 2)
    True
    """
    text = cell_id if run_number <= 1 else f"{cell_id}#run={run_number}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


class CellFields(Protocol):
    """What a cell context copies from the spec a rank runs
    (:class:`cpmatrix.worker.protocol.CellSpec`; named here by its shape, as this module
    sits below it)."""

    @property
    def id(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def autocast(self) -> bool: ...
    @property
    def path(self) -> str: ...
    @property
    def level(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def platform(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def mutant(self) -> str: ...
    @property
    def run_number(self) -> int: ...


@dataclass(kw_only=True)
class CellContext:
    """The object a case receives. Attributes are read-only by convention.

    Why a shape apart from the ``CellSpec`` it is made from (:meth:`from_spec`): it is
    the user's API, and it holds the rank's live torch objects (mesh, device, dtype,
    generator) that no JSON record can carry.
    """

    #: The cell id, e.g. ``ring_attention[unit,2x2,fp64,autocast=off,reference]@cpu``.
    id: str
    #: This process's global rank and the world size (= mesh rows * cols).
    rank: int
    world_size: int
    #: A ``torch.distributed.device_mesh.DeviceMesh`` of shape (R, C), dims ("cp0", "cp1").
    mesh: Any
    #: ``torch.device`` for tensors (cpu, or this rank's cuda device).
    device: Any
    #: ``gloo`` or ``nccl``.
    backend: str
    #: ``torch.dtype`` of the cell (fp64 -> torch.float64, ...), and its axis name.
    dtype: Any
    dtype_name: str
    autocast: bool
    #: ``reference`` or ``kernel``.
    path: str
    level: str
    #: The target's extra axes for this cell, e.g. ``{"seq": 7}``.
    params: dict[str, Any]
    #: Derived from the id and the run number (:func:`seed_for`); python/numpy/torch RNGs
    #: are seeded with it.
    seed: int
    #: A ``torch.Generator`` seeded with ``seed``: identical draws on every rank.
    generator: Any
    #: A writable folder for this cell and rank.
    out_dir: Path
    #: The platform name (``cpu``, ``cuda``) and the target name.
    platform: str = "cpu"
    target: str = ""
    #: The planted bug switched on for this run (``cpmatrix run --mutants``), or None.
    mutant: str | None = None
    #: Which run of the cell this is: 1 for a plain run, 1..N with ``--runs-per-test N``.
    run_number: int = 1
    evidence: dict[str, EvidenceValue] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: CellFields, *, rank: int, mesh: Any, device: Any, backend: str,
                  dtype: Any, seed: int, generator: Any, out_dir: Path) -> CellContext:
        """The context of ``spec`` on ``rank``: the one copy of a cell's fields into what a
        case receives; the rest is the rank's (its mesh, device, ``torch`` dtype, ...).

        >>> from types import SimpleNamespace as S
        >>> spec = S(id="t@cpu", world_size=2, dtype="fp64", autocast=False, path="reference",
        ...          level="unit", params={"seq": 7}, platform="cpu", target="t", mutant="",
        ...          run_number=1)
        >>> ctx = CellContext.from_spec(spec, rank=1, mesh=None, device="cpu", backend="gloo",
        ...     dtype="float64", seed=3, generator=None, out_dir=Path("out"))
        >>> ctx.dtype_name, ctx.params, ctx.mutant
        ('fp64', {'seq': 7}, None)
        """
        return cls(
            id=spec.id, rank=rank, world_size=spec.world_size, mesh=mesh, device=device,
            backend=backend, dtype=dtype, dtype_name=spec.dtype, autocast=spec.autocast,
            path=spec.path, level=spec.level, params=dict(spec.params), seed=seed,
            generator=generator, out_dir=out_dir, platform=spec.platform, target=spec.target,
            mutant=spec.mutant or None, run_number=spec.run_number,
        )

    def record(self, name: str, value: EvidenceValue) -> None:
        """Attach evidence (a number or a short string) that ends up in the report."""
        if not isinstance(name, str) or not name:
            raise TypeError("record(name, value): name must be a non-empty string")
        if isinstance(value, bool | int | str):
            pass
        elif isinstance(value, float):
            if math.isnan(value):
                value = "nan"
        elif hasattr(value, "item"):  # a 0-d tensor or numpy scalar
            value = value.item()
        else:
            raise TypeError(f"record({name!r}, ...): evidence must be a number or a string, "
                            f"got {type(value).__name__}")
        if isinstance(value, str) and len(value) > MAX_EVIDENCE_CHARS:
            value = value[:MAX_EVIDENCE_CHARS] + "..."
        self.evidence[name] = value
