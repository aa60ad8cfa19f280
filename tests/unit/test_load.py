"""Loading matrices: the frozen schema, valid input, and every kind of bad input.

Bad input goes through the real CLI (``cpmatrix list``): exit 2, one line naming
file:line:column, the YAML path, the bad value and what is allowed, no traceback.
In each table row the offending line carries a ``#!`` comment; the test reads the
expected line number from it, so rows stay correct when edited.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cpmatrix.cli import main
from cpmatrix.errors import SpecError
from cpmatrix.matrix.load import ALLOWED_KEYS, load_matrix, parse_matrix
from cpmatrix.matrix.schema import TIMEOUT_CLASSES, Mesh
from matrix_files import HEAD, write_matrix

RESOURCES = Path(__file__).parents[1] / "resources"
COMPLETE = RESOURCES / "complete.yaml"

#: A valid target, for rows whose problem lies elsewhere.
A = '  - {name: a, case: "tiny:ok", level: unit}\n'
#: A valid target with an extra axis.
A_SEQ = '  - {name: a, case: "tiny:ok", level: unit, params: {seq: [7, 64]}}\n'
B = '  - {name: b, case: "tiny:ok", level: unit}\n'
MARK = "#!"
#: HEAD for parse_matrix (no file, so no pythonpath to resolve).
INLINE = HEAD.replace("pythonpath: [cases]\n", "")


def marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), 1) if MARK in line]
    assert len(lines) == 1, f"exactly one {MARK} line expected in:\n{text}"
    return lines[0]


def cli_list(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["list", "--matrix", str(path)])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_spec_error(
    rc: int, out: str, err: str, file: Path, line: int, yaml_path: str, fragments: tuple[str, ...]
) -> str:
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    message = lines[0]
    assert message.startswith(f"error: {file}:{line}:"), (message, line)
    if yaml_path:
        assert f": {yaml_path}: " in message, (message, yaml_path)
    for fragment in fragments:
        assert fragment in message, (message, fragment)
    return message


# --------------------------------------------------------------------------- schema


def test_allowed_keys_are_frozen() -> None:
    """The schema grows only on purpose: change this test together with the README."""
    assert ALLOWED_KEYS == {
        "matrix": ("version", "pythonpath", "defaults", "platforms", "targets", "exclude",
                   "include", "max_cells", "remote_cache"),
        "remote_cache": ("url", "read_only"),
        "defaults": ("mesh", "dtype", "autocast", "path"),
        "platform": ("backend", "device", "image", "env", "description", "max_ranks"),
        "target": ("name", "case", "level", "kind", "tags", "timeout", "platforms", "axes",
                   "params", "description", "spill", "pytest"),
        "target.axes": ("mesh", "dtype", "autocast", "path"),
        "target.spill": ("signature", "table", "configs", "archs", "num_warps", "num_stages",
                         "budget_bytes", "expect_spill"),
        "clause": ("target", "platform", "level", "mesh", "dtype", "autocast", "path"),
    }


def test_complete_example_uses_every_allowed_key_and_loads() -> None:
    """Every frozen key is really accepted: resources/complete.yaml uses each one."""
    raw = yaml.safe_load(COMPLETE.read_text())
    params = {p for t in raw["targets"] for p in t.get("params", {})}
    used = {
        "matrix": set(raw),
        "remote_cache": set(raw["remote_cache"]),
        "defaults": set(raw["defaults"]),
        "platform": {k for p in raw["platforms"].values() for k in p},
        "target": {k for t in raw["targets"] for k in t},
        "target.axes": {k for t in raw["targets"] for k in t.get("axes", {})},
        "target.spill": {k for t in raw["targets"] for k in t.get("spill", {})},
        "clause": {k for c in raw["exclude"] + raw["include"] for k in c} - params,
    }
    assert used == {section: set(keys) for section, keys in ALLOWED_KEYS.items()}
    matrix = load_matrix(COMPLETE)
    assert [t.name for t in matrix.targets] == ["ring_attention", "step_property",
                                                "softmax_spill", "table_spill", "plain_pytest"]
    assert matrix.targets[1].kind == "property" and matrix.targets[1].timeout_s == 30


# --------------------------------------------------------------------- valid input


def test_defaults_apply_and_targets_override(tmp_path: Path) -> None:
    path = write_matrix(tmp_path, HEAD + """\
defaults: {mesh: [1x1, 2x2], dtype: [fp32, bf16], autocast: [off, on]}
targets:
  - {name: a, case: "tiny:ok", level: unit}
  - {name: b, case: "tiny:ok", level: layer, axes: {dtype: fp64, path: [reference, kernel]}}
""")
    a, b = load_matrix(path).targets
    assert a.axes == (("mesh", ("1x1", "2x2")), ("dtype", ("fp32", "bf16")),
                      ("autocast", ("off", "on")), ("path", ("reference",)))
    assert b.axes == (("mesh", ("1x1", "2x2")), ("dtype", ("fp64",)),
                      ("autocast", ("off", "on")), ("path", ("reference", "kernel")))


def test_builtin_defaults_when_none_given(tmp_path: Path) -> None:
    (target,) = load_matrix(write_matrix(tmp_path, HEAD + "targets:\n" + A)).targets
    assert target.axes == (("mesh", ("1x1",)), ("dtype", ("fp64",)),
                           ("autocast", ("off",)), ("path", ("reference",)))
    assert target.timeout_s == 300 and target.kind == "parity" and target.platforms == ()


@pytest.mark.parametrize(
    ("written", "seconds"),
    [*((name, s) for name, s in TIMEOUT_CLASSES.items()), ("45", 45), ("0.4", 1), ("12.6", 13),
     ("86400", 86400)],  # the largest allowed (one day); above it is an error
)
def test_timeout_classes_and_seconds(written: str, seconds: int) -> None:
    target = f'{{name: a, case: "m:f", level: unit, timeout: {written}}}'
    m = parse_matrix(INLINE + f"targets: [{target}]")
    assert m.targets[0].timeout_s == seconds


def test_yaml_booleans_and_scalars_as_lists() -> None:
    """on/off/yes are YAML 1.1 booleans; a lone scalar counts as a one-element list."""
    m = parse_matrix(INLINE + """\
targets:
  - {name: a, case: "pkg.mod:fn", level: unit, axes: {autocast: [off, on], mesh: 2x3},
     tags: fast, params: {flag: [yes, false], seq: 7, name: "x.y"}}
""")
    (t,) = m.targets
    assert t.axis("autocast") == ("off", "on")
    assert t.axis("mesh") == ("2x3",)
    assert t.tags == ("fast",)
    assert t.params == (("flag", (True, False)), ("seq", (7,)), ("name", ("x.y",)))
    assert Mesh.parse("2x3").world_size == 6


def test_platforms_keep_env_and_order(tmp_path: Path) -> None:
    m = parse_matrix("""\
version: 1
platforms:
  cuda: {backend: nccl, device: cuda}
  cpu: {backend: gloo, device: cpu, env: {TRITON_INTERPRET: 1}}
targets: [{name: a, case: "m:f", level: unit, platforms: [cpu]}]
""")
    assert [p.name for p in m.platforms] == ["cuda", "cpu"]
    assert m.platform("cpu").env == (("TRITON_INTERPRET", "1"),)
    assert m.targets[0].platforms == ("cpu",)


def test_image_is_optional_and_a_platform_knows_where_it_is() -> None:
    # Only the docker runner needs an image (runners.resolve_runner refuses it without);
    # the local and sandbox runners run a platform that declares none.
    m = parse_matrix("""\
version: 1
platforms:
  cpu: {backend: gloo, device: cpu}
  cuda: {backend: nccl, device: cuda, image: docker/cuda.Dockerfile}
targets: [{name: a, case: "m:f", level: unit}]
""", file="m.yaml")
    assert m.platform("cpu").image is None and m.platform("cpu").where == "m.yaml:3"
    assert m.platform("cuda").image == "docker/cuda.Dockerfile"
    # where is for messages only: a platform's digest input is unchanged by it
    assert "where" not in m.platform("cpu").to_dict()


def test_pythonpath_is_relative_to_the_matrix_file(tmp_path: Path) -> None:
    path = write_matrix(tmp_path, HEAD + "targets:\n" + A)
    assert load_matrix(path).pythonpath == (str((tmp_path / "cases").resolve()),)


# ----------------------------------------------------------------------- bad input

TIMEOUT_ALLOWED = "short (60 s), moderate (300 s), long (900 s), eternal (3600 s)"


def _mesh_row(bad: str) -> object:
    """Four targets so the path reads like the issue's example, targets[3].axes.mesh[1]."""
    text = HEAD + "targets:\n" + A + B + (
        '  - {name: c, case: "tiny:ok", level: unit}\n'
        '  - name: d\n'
        '    case: "tiny:ok"\n'
        '    level: unit\n'
        '    axes:\n'
        f'      mesh: [1x1, {bad}] #!\n'
    )
    return pytest.param(text, "targets[3].axes.mesh[1]",
                        (f"malformed mesh {bad!r}", "allowed: e.g. 1x1"), id=f"mesh-{bad}")


def _timeout_row(bad: str, shown: str) -> object:
    text = HEAD + f'targets:\n  - {{name: a, case: "tiny:ok", level: unit, timeout: {bad}}} #!\n'
    return pytest.param(text, "targets[0].timeout", (f"bad timeout {shown}", TIMEOUT_ALLOWED),
                        id=f"timeout-{bad}")


def _case_row(bad: str, shown: str = "") -> object:
    """``bad`` as written inside YAML double quotes; ``shown`` as the message quotes it."""
    text = HEAD + f'targets:\n  - name: a\n    level: unit\n    case: "{bad}" #!\n'
    return pytest.param(text, "targets[0].case",
                        (f"bad case {shown or repr(bad)}", "module:function"), id=f"case-{bad}")


BAD_INPUT = [
    # --- YAML syntax
    pytest.param(HEAD + "targets:\n  - name: a\n   case: x #!\n", "",
                 ("YAML syntax error", "expected <block end>"), id="syntax-indent"),
    pytest.param(HEAD + "targets:\n\t- {name: a} #!\n", "",
                 ("YAML syntax error", "'\\t'"), id="syntax-tab"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "tiny:ok" level: unit} #!\n', "",
                 ("YAML syntax error", "expected ',' or '}'"), id="syntax-flow-comma"),
    pytest.param(HEAD + "targets: *nowhere #!\n", "",
                 ("YAML syntax error", "undefined alias"), id="syntax-alias"),
    pytest.param(HEAD + "targets: []\n--- #!\nversion: 1\n", "",
                 ("YAML syntax error", "single document"), id="syntax-two-documents"),
    pytest.param(HEAD + "targets:\n" + A + "version: 1 #!\n", "version",
                 ("duplicate key 'version'",), id="duplicate-key"),
    pytest.param(HEAD + "targets:\n  - {name: !!python/name:os.system a, case: t:o, level: unit}"
                 " #!\n",
                 "targets[0].name", ("cannot read", "python/name"), id="unsafe-tag"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, timeout: !!int x} #!\n',
                 "targets[0].timeout", ("cannot read 'x'",), id="bad-explicit-tag"),
    # --- unknown key, at each level
    pytest.param("version: 1\ncolour: red #!\n" + HEAD[11:] + "targets:\n" + A, "colour",
                 ("unknown key 'colour'", "allowed: version, pythonpath, defaults"),
                 id="unknown-key-top"),
    pytest.param(HEAD + "defaults: {mesh: [1x1], seq: [1]} #!\ntargets:\n" + A, "defaults.seq",
                 ("unknown key 'seq'", "allowed: mesh, dtype, autocast, path"),
                 id="unknown-key-defaults"),
    pytest.param("version: 1\nplatforms:\n  cpu: {backend: gloo, device: cpu, image: i, gpus: 2} #!"
                 "\ntargets:\n" + A, "platforms.cpu.gpus",
                 ("unknown key 'gpus'", "allowed: backend, device, image, env, description"),
                 id="unknown-key-platform"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit, size: 3} #!\n',
                 "targets[0].size", ("unknown key 'size'", "allowed: name, case, level"),
                 id="unknown-key-target"),
    pytest.param(HEAD + 'targets:\n  - name: a\n    case: "tiny:ok"\n    level: unit\n'
                 "    axes: {mesh: [1x1], seq: [1]} #!\n", "targets[0].axes.seq",
                 ("unknown key 'seq'", "allowed: mesh, dtype, autocast, path"),
                 id="unknown-key-target-axes"),
    pytest.param(HEAD + "targets:\n" + A + "exclude:\n  - {dtype: fp64, colour: red} #!\n",
                 "exclude[0].colour", ("unknown key 'colour'", "allowed: target, platform"),
                 id="unknown-key-exclude"),
    pytest.param(HEAD + "targets:\n" + A + "include:\n  - {target: a, colour: red} #!\n",
                 "include[0].colour", ("unknown key 'colour'",), id="unknown-key-include"),
    # --- missing required keys
    pytest.param(HEAD + "targets:\n  - {name: a, level: unit} #!\n", "targets[0]",
                 ("target needs 'case'",), id="missing-case"),
    pytest.param("version: 1\nplatforms:\n  cpu: {backend: gloo, image: i} #!\ntargets:\n" + A,
                 "platforms.cpu", ("needs 'device'",), id="missing-device"),
    pytest.param("version: 1 #!\nplatforms: {cpu: {backend: gloo, device: cpu, image: i}}\n",
                 "", ("missing 'targets'",), id="missing-targets"),
    pytest.param(HEAD + "targets: [] #!\n", "targets", ("no target declared",),
                 id="no-targets"),
    # --- wrong type
    pytest.param(HEAD + "targets: {a: 1} #!\n", "targets", ("expected a list, got a mapping",),
                 id="type-targets"),
    pytest.param("version: 1\nplatforms: [cpu] #!\ntargets:\n" + A, "platforms",
                 ("expected a mapping, got a list",), id="type-platforms"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit, tags: {x: 1}} #!\n',
                 "targets[0].tags", ("expected a list, got a mapping",), id="type-tags"),
    pytest.param(HEAD + 'targets:\n  - {name: 5, case: "tiny:ok", level: unit} #!\n',
                 "targets[0].name", ("expected a string, got 5",), id="type-name"),
    pytest.param(HEAD + 'targets:\n  - name: a\n    case: "tiny:ok"\n    level: unit\n'
                 "    axes: {mesh: {rows: 2}} #!\n", "targets[0].axes.mesh",
                 ("expected a list, got a mapping",), id="type-mesh"),
    pytest.param(HEAD + 'targets:\n  - name: a\n    case: "tiny:ok"\n    level: #!\n',
                 "targets[0].level", ("got None",), id="type-null"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit, timeout: [9]} #!\n',
                 "targets[0].timeout", ("expected a scalar, got a list",), id="type-timeout"),
    pytest.param(HEAD.replace("version: 1", "version: one #!") + "targets:\n" + A, "version",
                 ("unsupported version 'one'", "allowed: 1"), id="type-version"),
    pytest.param(HEAD + 'targets:\n  - name: a\n    case: "tiny:ok"\n    level: unit\n'
                 "    axes: {dtype: []} #!\n", "targets[0].axes.dtype",
                 ("empty list",), id="type-empty-list"),
    pytest.param(HEAD.replace("pythonpath: [cases]", "pythonpath: [nowhere] #!")
                 + "targets:\n" + A, "pythonpath[0]", ("no such directory",),
                 id="pythonpath-missing-dir"),
    pytest.param("- just\n- a list #!\n".replace("- just\n", ""), "",
                 ("expected a mapping, got a list",), id="type-root"),
    # --- unknown axis values
    pytest.param(HEAD + 'targets:\n  - name: a\n    case: "tiny:ok"\n    level: unit\n'
                 "    axes: {dtype: [fp32, fp8]} #!\n", "targets[0].axes.dtype[1]",
                 ("unknown dtype 'fp8'", "allowed: fp64, fp32, bf16, fp16"), id="value-dtype"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: kernel} #!\n',
                 "targets[0].level", ("unknown level 'kernel'",
                                      "allowed: unit, layer, module, workflow"), id="value-level"),
    pytest.param(HEAD + 'targets:\n  - name: a\n    case: "tiny:ok"\n    level: unit\n'
                 "    axes: {path: [triton]} #!\n", "targets[0].axes.path[0]",
                 ("unknown path 'triton'", "allowed: reference, kernel"), id="value-path"),
    pytest.param(HEAD + 'targets:\n  - name: a\n    case: "tiny:ok"\n    level: unit\n'
                 "    axes: {autocast: [off, maybe]} #!\n", "targets[0].axes.autocast[1]",
                 ("unknown autocast value 'maybe'", "allowed: off, on"), id="value-autocast"),
    pytest.param(HEAD + "defaults: {dtype: [fp128]} #!\ntargets:\n" + A, "defaults.dtype[0]",
                 ("unknown dtype 'fp128'",), id="value-defaults-dtype"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit, kind: fuzz} #!\n',
                 "targets[0].kind", ("unknown kind 'fuzz'", "allowed: parity, property"),
                 id="value-kind"),
    pytest.param("version: 1\nplatforms:\n  cpu: {backend: mpi, device: cpu, image: i} #!\n"
                 "targets:\n" + A, "platforms.cpu.backend",
                 ("unknown backend 'mpi'", "allowed: gloo, nccl"), id="value-backend"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, platforms: [tpu]} #!\n',
                 "targets[0].platforms[0]", ("unknown platform 'tpu'", "allowed: cpu"),
                 id="value-target-platform"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, platforms: [cpu, cpu]}'
                 " #!\n", "targets[0].platforms[1]", ("duplicate platform 'cpu'",),
                 id="value-duplicate-platform"),
    pytest.param(HEAD + "defaults: {dtype: [fp32, fp32]} #!\ntargets:\n" + A, "defaults.dtype[1]",
                 ("duplicate dtype value 'fp32'",), id="value-duplicate"),
    # --- malformed mesh
    _mesh_row("2x"),
    _mesh_row("0x2"),
    _mesh_row("2*2"),
    _mesh_row("-1x2"),
    _mesh_row("x2"),
    _mesh_row("2x2x2"),
    pytest.param(HEAD + "defaults: {mesh: 2x} #!\ntargets:\n" + A, "defaults.mesh",
                 ("malformed mesh '2x'",), id="mesh-defaults"),
    pytest.param(HEAD + "targets:\n" + A + "exclude:\n  - {mesh: [2*2]} #!\n",
                 "exclude[0].mesh[0]", ("malformed mesh '2*2'",), id="mesh-exclude"),
    # --- names
    pytest.param(HEAD + "targets:\n" + A + '  - {name: a, case: "tiny:ok", level: layer} #!\n',
                 "targets[1].name", ("duplicate target name 'a' (first at targets[0])",),
                 id="duplicate-target"),
    pytest.param(HEAD + 'targets:\n  - {name: ring-attn, case: "tiny:ok", level: unit} #!\n',
                 "targets[0].name", ("bad target name 'ring-attn'",), id="bad-target-name"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, tags: [a b]} #!\n',
                 "targets[0].tags[0]", ("bad tag 'a b'",), id="bad-tag"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, params: {dtype: [1]}}'
                 " #!\n", "targets[0].params.dtype", ("bad extra-axis name 'dtype'",),
                 id="param-shadows-axis"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, params: {s: [a/b]}}'
                 " #!\n", "targets[0].params.s[0]", ("'a/b' cannot appear in a cell id",),
                 id="param-unsafe-value"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, params: {s: ["7\\n"]}}'
                 " #!\n", "targets[0].params.s[0]", ("cannot appear in a cell id",),
                 id="param-newline-value"),
    # --- case not module:function
    _case_row("tiny.ok"),
    _case_row("tiny:"),
    _case_row(":ok"),
    _case_row("tiny:ok:more"),
    _case_row("my mod:ok"),
    _case_row("tiny:ok\\n", "'tiny:ok\\n'"),
    # --- include / exclude naming an unknown axis or value
    pytest.param(HEAD + "targets:\n" + A + "exclude:\n  - {seq: 7} #!\n", "exclude[0].seq",
                 ("unknown key 'seq'",), id="clause-unknown-axis"),
    pytest.param(HEAD + "targets:\n" + A_SEQ + "exclude:\n  - {seq: [7, 9]} #!\n",
                 "exclude[0].seq[1]", ("unknown value 9 for extra axis 'seq'", "allowed: 64, 7"),
                 id="clause-unknown-param-value"),
    pytest.param(HEAD + "targets:\n" + A + "include:\n  - {dtype: fp8} #!\n", "include[0].dtype",
                 ("unknown dtype 'fp8'",), id="include-unknown-dtype"),
    pytest.param(HEAD + "targets:\n" + A + "exclude:\n  - {target: zz} #!\n",
                 "exclude[0].target", ("unknown target 'zz'", "allowed: a"),
                 id="clause-unknown-target"),
    pytest.param(HEAD + "targets:\n" + A + "include:\n  - {platform: tpu, dtype: fp32} #!\n",
                 "include[0].platform", ("unknown platform 'tpu'",), id="clause-unknown-platform"),
    pytest.param(HEAD + "targets:\n" + A + A_SEQ.replace("name: a", "name: s")
                 + "include:\n  - {seq: 7, target: a} #!\n", "include[0].seq",
                 ("extra axis 'seq' is not declared", "declared by: s"),
                 id="clause-axis-of-another-target"),
    pytest.param(HEAD + "targets:\n" + A + "exclude:\n  - {level: kernel} #!\n",
                 "exclude[0].level", ("unknown level 'kernel'",), id="clause-unknown-level"),
    pytest.param(HEAD + "targets:\n" + A + "exclude:\n  - {} #!\n", "exclude[0]",
                 ("empty clause",), id="clause-empty"),
    pytest.param(HEAD + "targets:\n" + A + "exclude:\n  - {autocast: sometimes} #!\n",
                 "exclude[0].autocast", ("unknown autocast value 'sometimes'",),
                 id="clause-unknown-autocast"),
    # --- two cells with the same id
    pytest.param(HEAD + "targets:\n" + A_SEQ.replace("7, 64", "7") +
                 'include:\n  - {target: a, seq: "7"} #!\n', "include[0].seq",
                 ("two cells with the same id", "seq='7' (str)", "seq=7 (int)"),
                 id="same-id-include-str"),
    pytest.param(HEAD + "targets:\n" + A_SEQ + 'exclude:\n  - {seq: 7}\n'
                 'include:\n  - {seq: "7", dtype: fp64} #!\n', "include[0].seq",
                 ("two cells with the same id",), id="same-id-include-after-exclude"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, params: {s: [7, "7"]}}'
                 " #!\n", "targets[0].params.s[1]", ("duplicate value '7'",),
                 id="same-id-params"),
    pytest.param(HEAD + 'targets:\n  - {name: a, case: "t:o", level: unit, params: {f: [true, '
                 '"true"]}} #!\n', "targets[0].params.f[1]", ("duplicate value 'true'",),
                 id="same-id-bool-params"),
    # --- timeout neither a class nor a positive number
    _timeout_row("fast", "'fast'"),
    _timeout_row("0", "0"),
    _timeout_row("-5", "-5"),
    _timeout_row("0.0", "0.0"),
    _timeout_row("true", "True"),
    _timeout_row(".inf", "inf"),
    _timeout_row(".nan", "nan"),
    _timeout_row('"60"', "'60'"),
    _timeout_row("Short", "'Short'"),
]


@pytest.mark.parametrize(("text", "yaml_path", "fragments"), BAD_INPUT)
def test_bad_input_exits_2_with_line_and_path(
    text: str, yaml_path: str, fragments: tuple[str, ...], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_matrix(tmp_path, text)
    rc, out, err = cli_list(path, capsys)
    assert_one_spec_error(rc, out, err, path, marked_line(text), yaml_path, fragments)


@pytest.mark.parametrize(
    ("text", "token"),
    [
        (HEAD + "targets:\n" + A + B.replace("unit", "unit, axes: {mesh: [1x1, 2*2]}")
         + "#! (marker on the next line keeps the mesh last)\n", "2*2"),
        (HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: kernel}\n', "kernel"),
        (HEAD + "targets:\n" + A + "exclude:\n  - {colour: red}\n", "colour"),
    ],
    ids=["mesh", "level", "clause-key"],
)
def test_error_column_points_at_the_bad_token(
    text: str, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_matrix(tmp_path, text)
    rc, _, err = cli_list(path, capsys)
    lines = text.splitlines()
    line = next(n for n, s in enumerate(lines, 1) if token in s)
    column = lines[line - 1].index(token) + 1
    assert rc == 2
    assert err.startswith(f"error: {path}:{line}:{column}: "), err


def test_missing_file_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    rc, out, err = cli_list(missing, capsys)
    assert (rc, out) == (2, "")
    assert err == (f"error: {missing}: no such matrix file; give --matrix FILE, or set "
                   "matrix = \"FILE\" in [tool.cpmatrix] of your pyproject.toml (`cpmatrix "
                   "init` writes a starter project)\n")


def test_no_matrix_named_says_how_to_name_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml with [tool.cpmatrix] up from here
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no matrix: give --matrix FILE, or set matrix = ")
    assert "[tool.cpmatrix]" in err and "cpmatrix init" in err


def test_absurdly_nested_yaml_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_matrix(tmp_path, HEAD + "targets: " + "[" * 5000 + "]" * 5000 + "\n")
    rc, out, err = cli_list(path, capsys)
    assert (rc, out) == (2, "")
    assert err == f"error: {path}:1:1: YAML nested too deeply to be a matrix\n"


def test_not_utf8_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(b"version: 1\nname: \xff\xfe\n")
    rc, _, err = cli_list(path, capsys)
    assert rc == 2 and "cannot read matrix" in err and "Traceback" not in err


def test_spec_error_carries_its_parts() -> None:
    bad = '  - {name: a, case: "t:o", level: layer, kind: x}'
    with pytest.raises(SpecError) as info:
        parse_matrix(INLINE + f"targets:\n{bad}\n", file="inline.yaml")
    e = info.value
    column = bad.index("kind: x") + len("kind: ") + 1
    assert (e.file, e.line, e.column, e.yaml_path) == ("inline.yaml", 5, column, "targets[0].kind")
    assert e.message == "unknown kind 'x'"
    assert e.allowed == "parity, property, spill, pytest"
