"""RNG entropy property tests: fingerprint every draw per rank, assert the structure after.

No distributed RNG reproduces a single-device draw, so random code (noise, dropout masks,
sampled coordinates) has no serial value oracle. What must hold instead is the *entropy
structure*: draws for different shards of a sharded axis are independent (not the same
numbers tiled across ranks), draws on a replicated axis are identical.

:class:`RngRecorder` wraps the draw functions of python ``random``, numpy's legacy
``np.random.*`` and torch (``torch.randn`` & co., ``Tensor.normal_`` & co.) and
fingerprints each result - without consuming randomness, changing results or raising
(capture errors are counted, never propagated). :func:`assert_entropy` then checks the
fingerprints of all ranks, gathered in the case or loaded from the per-rank JSON files in
the parent after the join.

What a fingerprint holds: label (a :meth:`RngRecorder.scope` name, else the caller's
``file:line``), shape, dtype, a digest of all bytes, and hashes of every window of 4
consecutive elements of the first 1024: shared windows between ranks mean the same stream
(tiled, or overlapping at an offset), which a digest alone would miss.

Example (a complete property case)::

    from cpmatrix.parity import RngRecorder, assert_entropy

    def noise_case(cell):
        with RngRecorder(cell) as rec:
            with rec.scope("noise"):
                my_cp_noise(cell.mesh, shape=(64, 8))       # the code under test
        rec.save()                    # cell.out_dir/rng_fingerprints.rank<r>.json
        assert_entropy(rec.gather(), sharded=("cp0",), replicated=("cp1",),
                       labels=("noise",), min_numel=64)

Limitations: ``numpy.random.Generator`` methods (a C type) and draws made inside C++
(dropout, ``torch.distributed.tensor.randn``) cannot be patched; functions imported by name
before recording (``from random import random``) are not seen.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from cpmatrix.parity.errors import Check, EntropyError, odd_input_fails

__all__ = [
    "EntropyReport",
    "RngRecorder",
    "assert_entropy",
    "load_fingerprints",
]

#: File name of one rank's fingerprints in ``cell.out_dir``.
FILE_PATTERN: Final = "rng_fingerprints.rank{rank}.json"
WINDOW: Final = 4
MAX_ELEMENTS: Final = 1024

_PY_RANDOM: Final = (
    "random",
    "uniform",
    "gauss",
    "normalvariate",
    "lognormvariate",
    "expovariate",
    "betavariate",
    "triangular",
    "randint",
    "randrange",
    "choice",
    "choices",
    "sample",
    "shuffle",
    "getrandbits",
)
_NP_RANDOM: Final = (
    "rand",
    "randn",
    "random",
    "random_sample",
    "standard_normal",
    "normal",
    "uniform",
    "randint",
    "permutation",
    "choice",
    "shuffle",
    "integers",
)
_TORCH_FUNCS: Final = (
    "rand",
    "randn",
    "randint",
    "randperm",
    "normal",
    "bernoulli",
    "multinomial",
    "poisson",
    "rand_like",
    "randn_like",
    "randint_like",
)
_TENSOR_METHODS: Final = (
    "normal_",
    "uniform_",
    "bernoulli_",
    "random_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
)


def _hash8(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


def _tensor_bytes(t: torch.Tensor) -> tuple[bytes, int]:
    local = t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t
    flat = local.detach().reshape(-1).contiguous().cpu()
    return flat.view(torch.uint8).numpy().tobytes(), flat.element_size()


def _value_bytes(value: Any) -> tuple[bytes, int, list[int], str]:
    """(bytes, item size, shape, dtype) of a draw's result."""
    if isinstance(value, torch.Tensor):
        data, size = _tensor_bytes(value)
        return data, size, list(value.shape), str(value.dtype)
    if hasattr(value, "dtype") and hasattr(value, "tobytes"):  # numpy array or scalar
        import numpy as np

        arr = np.ascontiguousarray(value)
        return arr.tobytes(), max(1, arr.itemsize), list(arr.shape), f"numpy.{arr.dtype}"
    items = list(value) if isinstance(value, list | tuple) else [value]
    packed = b"".join(
        struct.pack("<d", float(x))
        if isinstance(x, float)
        else repr(x).encode().ljust(16, b"\0")[:16]
        for x in items
    )
    return packed, 8 if all(isinstance(x, float) for x in items) else 16, [len(items)], "python"


@dataclass(slots=True)
class _Patch:
    owner: Any
    name: str
    original: Any


class RngRecorder:
    """Fingerprints every RNG draw on this rank while active (a context manager).

    ``cell`` supplies rank, mesh coordinates and ``out_dir``; without a cell pass ``rank``
    and ``coords``. Nested recorders are refused (the patches would stack).
    """

    _active: RngRecorder | None = None

    def __init__(
        self,
        cell: Any = None,
        *,
        rank: int | None = None,
        coords: Sequence[int] | None = None,
        mesh_shape: Sequence[int] | None = None,
        out_dir: str | Path | None = None,
    ) -> None:
        mesh = getattr(cell, "mesh", None)
        self.mesh = mesh
        self.rank = rank if rank is not None else int(getattr(cell, "rank", 0))
        if coords is None and mesh is not None:
            coords = list(mesh.get_coordinate() or [])
        self.coords = list(coords or [])
        self.mesh_shape = list(mesh_shape or (list(mesh.shape) if mesh is not None else []))
        self.dim_names = list(getattr(mesh, "mesh_dim_names", None) or ["cp0", "cp1"])
        self.out_dir = Path(out_dir) if out_dir is not None else getattr(cell, "out_dir", None)
        self.draws: list[dict[str, Any]] = []
        self.capture_errors = 0
        self._labels: list[str] = []
        self._counts: dict[str, int] = {}
        self._patches: list[_Patch] = []
        self._busy = threading.local()

    # -- patching ------------------------------------------------------------------

    def __enter__(self) -> RngRecorder:
        if RngRecorder._active is not None:
            raise RuntimeError("an RngRecorder is already active")
        RngRecorder._active = self
        for name in _PY_RANDOM:
            self._patch(random, name, f"random.{name}")
        try:
            import numpy as np

            for name in _NP_RANDOM:
                self._patch(np.random, name, f"numpy.random.{name}")
        except ImportError:  # numpy is optional for the recorder
            pass
        for name in _TORCH_FUNCS:
            self._patch(torch, name, f"torch.{name}")
        for name in _TENSOR_METHODS:
            self._patch(torch.Tensor, name, f"Tensor.{name}")
        return self

    def __exit__(self, *exc: object) -> None:
        for patch in reversed(self._patches):
            setattr(patch.owner, patch.name, patch.original)
        self._patches.clear()
        RngRecorder._active = None

    def _patch(self, owner: Any, name: str, source: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        wrapper = self._wrap(original, source, in_place=name == "shuffle" or name.endswith("_"))
        try:
            setattr(owner, name, wrapper)
        except (AttributeError, TypeError):  # a C type: not patchable, skip (never raise)
            return
        self._patches.append(_Patch(owner, name, original))

    def _wrap(
        self, original: Callable[..., Any], source: str, in_place: bool
    ) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(recorder._busy, "on", False):
                return original(*args, **kwargs)
            state = recorder._state_digest(source, kwargs)
            result = original(*args, **kwargs)
            recorder._busy.on = True
            try:
                drawn = args[0] if in_place and args else result
                recorder._record(source, drawn, state)
            except Exception:  # capture must never change the run
                recorder.capture_errors += 1
            finally:
                recorder._busy.on = False
            return result

        return wrapper

    def _state_digest(self, source: str, kwargs: Mapping[str, Any]) -> str:
        if not (source.startswith("torch.") or source.startswith("Tensor.")):
            return ""
        try:
            gen = kwargs.get("generator") or torch.default_generator
            return hashlib.blake2b(bytes(gen.get_state().numpy()), digest_size=8).hexdigest()
        except Exception:
            return ""

    def _record(self, source: str, value: Any, state: str) -> None:
        data, item, shape, dtype = _value_bytes(value)
        label = self._labels[-1] if self._labels else _call_site()
        index = self._counts.get(label, 0)
        self._counts[label] = index + 1
        n = len(data) // item
        head = data[: MAX_ELEMENTS * item]
        k = min(WINDOW, max(1, n))
        windows = sorted(
            {
                _hash8(head[i * item : (i + k) * item])
                for i in range(max(1, len(head) // item - k + 1))
            }
        )
        self.draws.append(
            {
                "source": source,
                "label": label,
                "index": index,
                "shape": shape,
                "dtype": dtype,
                "numel": n,
                "digest": hashlib.sha256(data).hexdigest()[:32],
                "state": state,
                "windows": windows,
            }
        )

    @contextmanager
    def scope(self, label: str) -> Iterator[None]:
        """Label the draws made inside (labels are how ranks' draws are matched)."""
        self._labels.append(label)
        try:
            yield
        finally:
            self._labels.pop()

    # -- results -------------------------------------------------------------------

    def fingerprints(self) -> dict[str, Any]:
        """This rank's fingerprints (JSON-ready)."""
        return {
            "rank": self.rank,
            "coords": self.coords,
            "mesh_shape": self.mesh_shape,
            "dim_names": self.dim_names,
            "capture_errors": self.capture_errors,
            "draws": self.draws,
        }

    def save(self, out_dir: str | Path | None = None) -> Path:
        """Write ``rng_fingerprints.rank<r>.json`` (temp file + rename: never half-written)."""
        folder = Path(out_dir) if out_dir is not None else self.out_dir
        if folder is None:
            raise ValueError("save(): no out_dir (pass one, or record with a cell)")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / FILE_PATTERN.format(rank=self.rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.fingerprints()))
        tmp.replace(path)
        return path

    def gather(self, mesh: Any = None) -> list[dict[str, Any]]:
        """Every rank's fingerprints, gathered over the mesh's groups (call on every rank)."""
        import torch.distributed as dist

        from cpmatrix.parity.checks import gather_object_over_mesh

        mesh = mesh if mesh is not None else self.mesh
        if mesh is None or not dist.is_initialized():
            return [self.fingerprints()]
        return gather_object_over_mesh(self.fingerprints(), mesh)


def _call_site() -> str:
    """The first frame outside this module and torch/numpy/random: where the draw was asked."""
    frame = sys._getframe(2)
    skip = (__file__, "/torch/", "/numpy/", "/random.py", "/functools.py", "/contextlib.py")
    while frame is not None and any(s in frame.f_code.co_filename for s in skip):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


def load_fingerprints(root: str | Path) -> list[dict[str, Any]]:
    """Every ``rng_fingerprints.rank*.json`` in ``root`` or its rank folders (``root/rank1/``),
    read in the parent after the join. Deeper folders (a mutant run's) are not mixed in."""
    found: dict[int, dict[str, Any]] = {}
    pattern = "rng_fingerprints.rank*.json"
    for path in sorted([*Path(root).glob(pattern), *Path(root).glob(f"*/{pattern}")]):
        data = json.loads(path.read_text())
        if data["rank"] in found:
            raise ValueError(f"two fingerprint files for rank {data['rank']} under {root}")
        found[data["rank"]] = data
    return [found[r] for r in sorted(found)]


@dataclass(frozen=True, slots=True)
class EntropyReport:
    """What :func:`assert_entropy` compared (record it as evidence)."""

    ranks_exercised: int
    disjoint_pairs: int
    identical_pairs: int
    labels: tuple[str, ...]
    lines: tuple[str, ...] = field(default_factory=tuple)


def assert_entropy(
    fingerprints: Sequence[Mapping[str, Any]],
    *,
    sharded: Sequence[str] = ("cp0",),
    replicated: Sequence[str] = ("cp1",),
    labels: Sequence[str] | None = None,
    min_ranks: int | None = None,
    min_numel: int = 16,
) -> EntropyReport:
    """Assert the entropy structure over all ranks' fingerprints; raise :class:`EntropyError`.

    - ranks whose coordinates differ on a ``sharded`` mesh axis drew disjoint streams (no
      shared 4-element window) for every checked label;
    - ranks with the same coordinates on the sharded axes, differing only on ``replicated``
      axes, drew identical sequences (same digests, same order);
    - exercise threshold: at least ``min_ranks`` ranks (default: all) drew at least one
      draw of ``min_numel`` elements under the checked labels, and on a mesh with a sharded
      axis > 1 at least one disjointness comparison happened.

    Draws smaller than ``min_numel`` are ignored (a scalar draw proves nothing). Malformed
    fingerprints or axes fail the check (``rng_entropy``) with the reason.
    """
    with odd_input_fails(Check.RNG_ENTROPY):
        return _entropy(fingerprints, sharded, replicated, labels, min_ranks, min_numel)


def _checked_streams(
    fingerprints: Sequence[Mapping[str, Any]], labels: Sequence[str] | None, min_numel: int
) -> tuple[dict[int, dict[str, list[Mapping[str, Any]]]], dict[int, list[int]]]:
    """Per rank, its draws of at least ``min_numel`` elements by label (only ``labels``,
    if given), and per rank its mesh coordinates."""
    per_rank: dict[int, dict[str, list[Mapping[str, Any]]]] = {}
    coords: dict[int, list[int]] = {}
    for fp in fingerprints:
        rank = int(fp["rank"])
        coords[rank] = list(fp["coords"])
        streams: dict[str, list[Mapping[str, Any]]] = {}
        for draw in fp["draws"]:
            if draw["numel"] >= min_numel and (labels is None or draw["label"] in labels):
                streams.setdefault(draw["label"], []).append(draw)
        per_rank[rank] = streams
    return per_rank, coords


def _entropy(
    fingerprints: Sequence[Mapping[str, Any]],
    sharded: Sequence[str],
    replicated: Sequence[str],
    labels: Sequence[str] | None,
    min_ranks: int | None,
    min_numel: int,
) -> EntropyReport:
    if not fingerprints:
        raise EntropyError("rng_entropy: no fingerprints (was anything recorded and saved?)")
    names = list(fingerprints[0].get("dim_names") or ["cp0", "cp1"])
    shape = list(fingerprints[0].get("mesh_shape") or [])
    unknown = [a for a in (*sharded, *replicated) if a not in names]
    if unknown or set(sharded) & set(replicated):
        raise ValueError(
            f"sharded={tuple(sharded)}, replicated={tuple(replicated)}: axes must be "
            f"distinct names among {names}"
        )
    sh_dims = [names.index(a) for a in sharded]
    rep_dims = [names.index(a) for a in replicated]
    per_rank, coords = _checked_streams(fingerprints, labels, min_numel)
    exercised = sum(1 for s in per_rank.values() if s)
    need = len(fingerprints) if min_ranks is None else min_ranks
    problems: list[str] = []
    if exercised < need:
        problems.append(
            f"exercise threshold: {exercised} of {len(fingerprints)} ranks drew "
            f">= {min_numel} elements under labels {labels or 'any'}, need {need}"
        )
    disjoint = identical = 0
    for a, b in itertools.combinations(sorted(per_rank), 2):
        ca, cb = coords[a], coords[b]
        differs_sharded = any(ca[d] != cb[d] for d in sh_dims)
        differs_rep = any(ca[d] != cb[d] for d in rep_dims)
        for label in sorted(set(per_rank[a]) | set(per_rank[b])):
            da, db = per_rank[a].get(label, []), per_rank[b].get(label, [])
            if differs_sharded:
                if not da or not db:
                    continue
                wa = set().union(*(set(d["windows"]) for d in da))
                wb = set().union(*(set(d["windows"]) for d in db))
                shared = len(wa & wb)
                disjoint += 1
                if shared:
                    problems.append(
                        f"{label!r}: ranks {a} {ca} and {b} {cb} differ on sharded "
                        f"axes {tuple(sharded)} but share {shared} of {min(len(wa), len(wb))} "
                        f"element windows: the same random stream (tiled seed?)"
                    )
            elif differs_rep:
                identical += 1
                if [d["digest"] for d in da] != [d["digest"] for d in db]:
                    problems.append(
                        f"{label!r}: ranks {a} {ca} and {b} {cb} differ only on "
                        f"replicated axes {tuple(replicated)} but drew different "
                        f"values ({len(da)} vs {len(db)} draws)"
                    )
    sharded_live = any(shape[d] > 1 for d in sh_dims) if shape else False
    if sharded_live and disjoint == 0:
        problems.append(
            f"exercise threshold: no pair of ranks on different {tuple(sharded)} "
            f"shards drew under the same label: disjointness was not tested"
        )
    if problems:
        raise EntropyError("rng_entropy: " + "; ".join(problems))
    found = sorted({lab for s in per_rank.values() for lab in s})
    lines = (
        f"{exercised}/{len(fingerprints)} ranks exercised (>= {min_numel} elements)",
        f"{disjoint} sharded rank-pair/label comparisons disjoint",
        f"{identical} replicated rank-pair/label comparisons identical",
    )
    return EntropyReport(exercised, disjoint, identical, tuple(found), lines)
