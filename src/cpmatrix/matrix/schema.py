"""The matrix schema: frozen value objects, validated once by :mod:`cpmatrix.matrix.load`.

Nothing past the loader re-checks input; these classes only hold it.

Example::

    >>> Mesh.parse("2x3").world_size
    6
    >>> timeout_seconds("moderate")
    300
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from cpmatrix.cell import TORCH_DTYPES
from cpmatrix.defaults import TIMEOUT_S
from cpmatrix.module_names import PYTEST_CASE

__all__ = [
    "ALLOWED_KEYS",
    "ARCHS",
    "AUTOCAST",
    "AXES",
    "DTYPES",
    "IMAGE_FORMS",
    "KINDS",
    "LEVELS",
    "MAX_CELLS",
    "MAX_RANKS",
    "MAX_TIMEOUT_S",
    "PATHS",
    "PYTEST_CASE",
    "TARGET_AXES",
    "TIMEOUT_CLASSES",
    "Cell",
    "Clause",
    "Matrix",
    "Mesh",
    "Platform",
    "RemoteCacheSetting",
    "Scalar",
    "SpillBlock",
    "Target",
    "image_form",
    "timeout_seconds",
]

Scalar = str | int | float | bool

LEVELS: Final = ("unit", "layer", "module", "workflow")
DTYPES: Final = tuple(TORCH_DTYPES)  # fp64, fp32, bf16, fp16
AUTOCAST: Final = ("off", "on")
PATHS: Final = ("reference", "kernel")
#: What a target runs as. ``parity`` and ``property`` cases run in worlds of ranks;
#: ``pytest`` targets' collected tests too, each rank in a pytest session (docs/pytest.md).
KINDS: Final = ("parity", "property", "spill", "pytest")
#: The standard axes, in the order they appear in a cell id.
AXES: Final = ("level", "mesh", "dtype", "autocast", "path")
#: The standard axes a target takes a list of values for (``level`` is one value).
TARGET_AXES: Final = AXES[1:]
#: The schema's keys, per section. A test freezes this so it only grows on purpose.
ALLOWED_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "matrix": ("version", "pythonpath", "defaults", "platforms", "targets", "exclude", "include",
               "max_cells", "remote_cache"),
    "remote_cache": ("url", "read_only"),
    "defaults": TARGET_AXES,
    "platform": ("backend", "device", "image", "env", "description", "max_ranks"),
    "target": (
        "name",
        "case",
        "level",
        "kind",
        "tags",
        "timeout",
        "platforms",
        "axes",
        "params",
        "description",
        "spill",
        "pytest",
    ),
    "target.axes": TARGET_AXES,
    "target.spill": (
        "signature",
        "table",
        "configs",
        "archs",
        "num_warps",
        "num_stages",
        "budget_bytes",
        "expect_spill",
    ),
    "clause": ("target", "platform", *AXES),
}

#: Names of environment variables and kernel parameters.
ENV_NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

#: An image reference as Docker reads one (distribution's grammar): an optional registry
#: host (with a dot or a port, or ``localhost``), lowercase path components, then a tag
#: and/or a content digest.
_IMAGE_REF_RE: Final = re.compile(
    r"^(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+:[0-9]+"
    r"|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+:[0-9]+)/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?\Z")
#: What a platform's ``image:`` may be (said by every error about it).
IMAGE_FORMS: Final = (
    "a Dockerfile path relative to the matrix file, named <flavor>.Dockerfile with "
    "requirements-<flavor>.txt beside it (docker/build-image.sh builds and tags it), or an "
    "image reference you built or pulled: NAME[:TAG] or NAME@sha256:<digest> (e.g. "
    "myteam/parity:2026-12 or registry.example.com/ml/parity@sha256:...)")


def image_form(value: str) -> Literal["dockerfile", "reference"] | None:
    """Whether a platform's ``image:`` names a Dockerfile or an image; None: neither.

    >>> image_form("../docker/cpu.Dockerfile"), image_form("myteam/parity:2026-12")
    ('dockerfile', 'reference')
    >>> image_form("ghcr.io/team/parity@sha256:" + "a" * 64), image_form("Parity:1")
    ('reference', None)
    """
    name = value.rsplit("/", 1)[-1]
    if name == "Dockerfile" or name.endswith(".Dockerfile"):
        return "dockerfile"
    return "reference" if _IMAGE_REF_RE.match(value) else None
#: GPU archs a spill gate compiles for, and their compute capability.
#: Archs a spec may name → the compute capability Triton compiles for.
#:
#: From sm_90 on, Triton always assembles the arch-specific ``a`` variant (``sm_90a`` on an
#: H100/H200), so the ``a`` archs measure what really runs. Plain ``sm_90`` measures the
#: same PTX retargeted to the portable arch (it fails in ptxas if the PTX uses wgmma or
#: setmaxnreg). Plain sm_100/sm_103/sm_120 are left out: Triton's PTX for them uses
#: arch-specific instructions even for a row reduction (``redux.f32``), so ptxas refuses
#: it. sm_100 and newer are assembled by the ``ptxas-blackwell`` that ships with Triton.
ARCHS: Final[Mapping[str, int]] = MappingProxyType({
    "sm_75": 75, "sm_80": 80, "sm_86": 86, "sm_87": 87, "sm_89": 89,
    "sm_90": 90, "sm_90a": 90, "sm_100a": 100, "sm_103a": 103, "sm_120a": 120,
})

#: Bazel's test-size timeouts, per cell (a target naming none gets ``moderate``'s).
TIMEOUT_CLASSES: Final = {"short": 60, "moderate": TIMEOUT_S, "long": 900, "eternal": 3600}
#: The longest timeout a cell may declare (one day): a bound, so that a typo such as
#: ``1e38`` is a spec error at load time rather than an overflow inside the ranks.
MAX_TIMEOUT_S: Final = 86400
#: Default largest world a platform may launch (``platforms.<p>.max_ranks`` overrides):
#: a mesh of 100x100 would otherwise start 10,000 processes.
MAX_RANKS: Final = 64
#: Default largest matrix, counted before exclusions (``max_cells:`` overrides). Checked
#: before expanding: a product of 10^7 cells would fill memory first.
MAX_CELLS: Final = 100_000

REDUCED_PRECISION: Final = ("bf16", "fp16")

# The patterns end in \Z, not $: "$" also matches before a trailing newline, which
# would let "7\n" through into an id (and a file name).
_MESH_RE: Final = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)\Z")
#: Names of targets, platforms and extra axes: safe in ids and file names.
NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
#: Rendered parameter values must stay safe in an id and a file name.
VALUE_RE: Final = re.compile(r"^[A-Za-z0-9_.+-]+\Z")


def timeout_seconds(value: str | int | float) -> int:
    """A Bazel timeout class or a positive, finite number of seconds, as whole seconds.

    ``KeyError`` for an unknown class, ``ValueError`` for a number that is not > 0
    and finite (the loader reports both with file and line before this is reached).
    """
    if isinstance(value, str):
        return TIMEOUT_CLASSES[value]
    not_finite = isinstance(value, float) and not math.isfinite(value)
    if isinstance(value, bool) or not_finite or value <= 0 or value > MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be a number of seconds in (0, {MAX_TIMEOUT_S}], "
                         f"got {value!r}")
    return max(1, round(value))


@dataclass(frozen=True, slots=True, order=True)
class Mesh:
    """A 2-D context-parallel mesh of ``rows x cols`` ranks, dims named ("cp0", "cp1")."""

    rows: int
    cols: int

    @classmethod
    def parse(cls, text: str) -> Mesh:
        m = _MESH_RE.match(text)
        if m is None:
            raise ValueError(f"bad mesh {text!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    @property
    def world_size(self) -> int:
        return self.rows * self.cols

    def __str__(self) -> str:
        return f"{self.rows}x{self.cols}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteCacheSetting:
    """A matrix's committed ``remote_cache:`` (the URL is checked when a run uses it,
    by :mod:`cpmatrix.cache.http`; errors name ``file:line:column``)."""

    url: str
    read_only: bool = False
    file: str = ""
    line: int = 0
    column: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Platform:
    """Where cells run: the process-group backend, the torch device and the image."""

    name: str
    #: torch.distributed backend: ``gloo`` or ``nccl``.
    backend: Literal["gloo", "nccl"]
    #: torch device type for tensors and the mesh.
    device: Literal["cpu", "cuda"]
    #: The image the docker runner runs: a ``<flavor>.Dockerfile`` it is built from
    #: (relative to the matrix file), or an image reference (``name:tag``, ``name@sha256:``;
    #: see :func:`image_form`). ``None`` where the platform declares none: it then runs
    #: with the local and sandbox runners only, and ``--runner docker`` is a usage error.
    image: str | None = None
    #: file:line of the platform in its matrix, for messages (not part of any digest).
    where: str = ""
    #: Extra environment for every cell on this platform (e.g. TRITON_INTERPRET=1).
    env: tuple[tuple[str, str], ...] = ()
    #: A short human description.
    description: str = ""
    #: The largest world (ranks) a cell of this platform may need; a sanity bound.
    max_ranks: int = MAX_RANKS

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "backend": self.backend,
            "device": self.device,
            "image": self.image,
            "env": dict(self.env),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SpillBlock:
    """What a ``kind: spill`` target compiles: a Triton kernel's signature and configs.

    Each (config, arch) pair becomes one cell with extra axes ``config`` and ``arch``.
    ``table`` names a ``SPILL_SPECS``-style dict in the kernel's module instead of an
    explicit ``signature``; a config then overrides the table entry's constexprs.
    """

    signature: tuple[tuple[str, str], ...] = ()
    table: str = ""
    #: config name -> constexpr values.
    configs: tuple[tuple[str, tuple[tuple[str, Scalar], ...]], ...] = (("default", ()),)
    archs: tuple[str, ...] = ("sm_80", "sm_90a")
    num_warps: int = 4
    num_stages: int = 3
    budget_bytes: int = 0
    #: A declared negative control: the gate passes only if the kernel DOES spill.
    expect_spill: bool = False

    def for_cell(self, kernel: str, config: str, arch: str) -> dict[str, object]:
        """The JSON-ready spec of one (config, arch) cell."""
        constexprs = dict(dict(self.configs)[config])
        return {
            "kernel": kernel, "signature": dict(self.signature), "table": self.table,
            "constexprs": constexprs, "arch": arch, "num_warps": self.num_warps,
            "num_stages": self.num_stages, "budget_bytes": self.budget_bytes,
            "expect_spill": self.expect_spill,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One rule of the matrix: a case and the axis values it is expanded over."""

    name: str
    #: ``module:function`` of the case, imported inside the worker.
    case: str
    level: str
    kind: str = "parity"
    tags: tuple[str, ...] = ()
    timeout_s: int = TIMEOUT_S
    #: Platform names this target may run on; empty means every platform.
    platforms: tuple[str, ...] = ()
    #: Standard axis values (mesh, dtype, autocast, path) after defaults are applied.
    axes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Extra axes of this target, in declaration order: name -> values.
    params: tuple[tuple[str, tuple[Scalar, ...]], ...] = ()
    description: str = ""
    #: file:line of the target in its matrix, for messages.
    where: str = ""
    #: (line, column) of the ``case`` value, so a missing case module is reported there.
    case_at: tuple[int, int] = (0, 0)
    #: For ``kind: spill``: the kernel's compile spec (``case`` names the kernel).
    spill: SpillBlock | None = None
    #: For ``kind: pytest``: the files, folders and node ids (absolute) whose collected
    #: tests are its cells (docs/pytest.md).
    pytest: tuple[str, ...] = ()

    def axis(self, name: str) -> tuple[str, ...]:
        for key, values in self.axes:
            if key == name:
                return values
        raise KeyError(name)

    def param_values(self, name: str) -> tuple[Scalar, ...]:
        for key, values in self.params:
            if key == name:
                return values
        raise KeyError(name)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.params)


@dataclass(frozen=True, slots=True, kw_only=True)
class Clause:
    """A partial combination used by ``exclude`` and ``include``.

    Each key maps to the values it accepts; a cell matches when every key does.
    Keys are standard axes, ``target``, ``platform`` or extra-axis names.
    """

    conditions: tuple[tuple[str, tuple[Scalar, ...]], ...]
    #: file:line of the clause, shown by ``list --why-excluded``.
    where: str = ""
    label: str = ""

    def get(self, key: str) -> tuple[Scalar, ...] | None:
        for k, values in self.conditions:
            if k == key:
                return values
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Matrix:
    """A loaded matrix file."""

    path: str
    version: int
    platforms: tuple[Platform, ...]
    targets: tuple[Target, ...]
    exclude: tuple[Clause, ...] = ()
    include: tuple[Clause, ...] = ()
    #: Directories (absolute) searched for case modules, before sys.path.
    pythonpath: tuple[str, ...] = ()
    #: The most cells the matrix may expand to (counted before exclusions).
    max_cells: int = MAX_CELLS
    #: The project's remote result cache (``--remote-cache`` overrides it).
    remote_cache: RemoteCacheSetting | None = None

    def platform(self, name: str) -> Platform:
        for p in self.platforms:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One runnable combination: a target at fixed axis values on one platform.

    ``id`` is stable, human-readable, unique within a matrix, safe as a file name,
    and parses back with :func:`cpmatrix.matrix.cellid.parse_cell_id`. The supervisor's
    shape of a cell, the one its digest covers; a run of it is a
    :class:`~cpmatrix.supervise.entry.Entry`, and the ranks get a
    :class:`~cpmatrix.worker.protocol.CellSpec` (docs/architecture.md, "A cell's shapes").
    """

    id: str
    target: str
    case: str
    kind: str
    level: str
    mesh: Mesh
    dtype: str
    autocast: bool
    path: str
    params: tuple[tuple[str, Scalar], ...]
    platform: str
    timeout_s: int
    tags: tuple[str, ...]
    digest: str = field(compare=False, default="")
    #: For spill cells: the canonical JSON of the compile spec (see SpillBlock.for_cell).
    spill: str = ""
    #: The case module's file whose source the digest covers; the worker refuses to run
    #: the case from any other file (a module of the same name earlier on its path).
    case_file: str = field(compare=False, default="")
    #: For pytest cells: the canonical JSON of the test to run (its node id, dialect) and
    #: of the pytest session it was collected in (``cpmatrix.kinds.pytest.spec``).
    pytest: str = ""

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    def spill_spec(self) -> dict[str, Any]:
        """A spill cell's compile spec (``SpillBlock.for_cell``); ``{}`` for other kinds."""
        spec: dict[str, Any] = json.loads(self.spill) if self.spill else {}
        return spec

    def to_dict(self) -> dict[str, object]:
        """The ``list --json`` view (a world file carries ``CellSpec.to_json`` instead)."""
        return {
            "id": self.id,
            "target": self.target,
            "case": self.case,
            "kind": self.kind,
            "level": self.level,
            "mesh": str(self.mesh),
            "world_size": self.world_size,
            "dtype": self.dtype,
            "autocast": self.autocast,
            "path": self.path,
            "platform": self.platform,
            "tags": list(self.tags),
            "timeout_s": self.timeout_s,
            "digest": self.digest,
            "params": dict(self.params),
            **({"spill": json.loads(self.spill)} if self.spill else {}),
            **({"pytest": json.loads(self.pytest)} if self.pytest else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Cell:
        params = d["params"]
        tags = d["tags"]
        assert isinstance(params, dict) and isinstance(tags, list)
        return cls(
            id=str(d["id"]),
            target=str(d["target"]),
            case=str(d["case"]),
            kind=str(d.get("kind", "parity")),
            level=str(d["level"]),
            mesh=Mesh.parse(str(d["mesh"])),
            dtype=str(d["dtype"]),
            autocast=bool(d["autocast"]),
            path=str(d["path"]),
            params=tuple(params.items()),
            platform=str(d["platform"]),
            timeout_s=int(str(d["timeout_s"])),
            tags=tuple(str(t) for t in tags),
            digest=str(d.get("digest", "")),
            spill=json.dumps(d["spill"], sort_keys=True) if d.get("spill") else "",
            pytest=json.dumps(d["pytest"], sort_keys=True, separators=(",", ":"))
            if d.get("pytest") else "",
        )
