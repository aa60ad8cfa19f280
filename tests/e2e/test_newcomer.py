"""A newcomer's session, scripted: a fresh folder, ``cpmatrix init``, no ``--matrix``
anywhere. It runs green, fails a planted bug (4 ranks, one traceback), pastes the
printed repro line, reruns with ``repro --failed``, reads ``show``, and meets the CLI's
habits (--version, did-you-mean, a missing case, the constraint count, the end-of-run
table, ``--json`` against its schema, the HTML in Chromium, shell completion).

One session (a module fixture, 5 world starts) serves every check.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cli_runner import run_cli
from cpmatrix import __version__
from cpmatrix.cli.json_out import SCHEMA_PATH
from cpmatrix.report.read import read_report

pytestmark = pytest.mark.slow

SCHEMA = json.loads(SCHEMA_PATH.read_text())
CELL = "allreduce_sum[unit,2x2,fp64,autocast=off,reference]@cpu"
CELL32 = "allreduce_sum[unit,2x2,fp32,autocast=off,reference]@cpu"
#: The planted bug: ranks 1-3 of a 2x2 mesh add 1 to their reduced shard.
BUG = ("    if cell.world_size == 4 and cell.rank > 0:\n"
       "        mine = mine + 1\n"
       '    cell.record("max_abs_err"')
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Session:
    root: Path
    steps: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def cli(self, name: str, *args: str, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        assert "--matrix" not in args  # the project's table names it
        proc = run_cli(*args, cwd=cwd or self.root, timeout=600)
        self.steps[name] = proc
        return proc

    def text(self, name: str) -> str:
        return self.steps[name].stdout + self.steps[name].stderr

    @property
    def cases(self) -> Path:
        return self.root / "tests" / "cp" / "cases.py"

    @property
    def matrix(self) -> Path:
        return self.root / "tests" / "cp" / "matrix.yaml"


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    s = Session(tmp_path_factory.mktemp("newcomer"))
    s.cli("init", "init")
    s.cli("config", "config")
    s.cli("list", "list")
    s.cli("green", "run", "--plain", "--no-cache")
    good = s.cases.read_text()
    s.cases.write_text(good.replace('    cell.record("max_abs_err"', BUG, 1))
    s.cli("red", "run", "--plain", "--no-cache", "--durations", "3")
    for name in ("report.xml", "report.html"):  # the red run's, kept: later runs replace them
        shutil.copy(s.root / "out" / name, s.root / f"red-{name}")
    pasted = next(ln.split("repro: ", 1)[1] for ln in s.steps["red"].stdout.splitlines()
                  if ln.strip().startswith("repro: ") and CELL in ln)
    words = shlex.split(pasted)
    assert words[:2] == ["cpmatrix", "repro"]
    s.cli("pasted", *words[1:], cwd=s.root / "tests")  # pasted in a subfolder of the project
    s.cli("failed", "repro", "--failed")
    s.cli("show", "show", "allreduce_sum[unit,2x2,fp64")
    s.cli("show-json", "show", "allreduce_sum[unit,2x2,fp64", "--json")
    s.cli("gate-json", "gate", "--json")
    s.cli("xff", "run", "-x", "--failed-first", "--no-cache", "--json")
    (s.root / "loose.yaml").write_text(  # skipped cells allowed: unrun ones must still fail
        "version: 1\npolicies:\n  loose: {tags: [release], allow_skipped: true}\n")
    s.cli("gate-x", "gate", "--gates", "loose.yaml", "--policy", "loose", "--json")
    s.cli("merge-json", "merge", "out", "--out", "merged", "--json")
    shutil.copy(s.root / "out" / "report.html", s.root / "xff-report.html")  # for Chromium
    # later runs that did not run the failures: another selection, then nothing selected
    s.cli("other", "run", "--plain", "-k", "tp_mlp")
    s.cli("none", "run", "-k", "nosuchthing")
    s.cli("failed-later", "repro", "--failed")
    return s


def test_init_writes_a_project_whose_config_is_found(session: Session) -> None:
    assert session.steps["init"].returncode == 0, session.text("init")
    config = session.steps["config"].stdout
    table = session.root / "pyproject.toml"
    assert config.splitlines()[0] == f"config: {table} [tool.cpmatrix]"
    assert re.search(rf"matrix += {re.escape(str(session.matrix))} +\({re.escape(str(table))}"
                     r":\d+\)", config), config
    listed = session.steps["list"]
    assert listed.returncode == 0 and len(listed.stdout.split()) == 5, listed.stderr


def test_the_starter_runs_green_with_a_table_per_target(session: Session) -> None:
    green = session.steps["green"]
    assert green.returncode == 0, session.text("green")
    assert "starting a world" in green.stdout  # a phase line while the world starts
    lines = green.stdout.splitlines()
    head = lines.index("target         cells  passed  failed  skipped   time")
    assert lines[head + 1].split()[:5] == ["allreduce_sum", "4", "4", "0", "0"]
    assert lines[head + 2].split()[:5] == ["tp_mlp", "1", "1", "0", "0"]


def test_a_4_rank_failure_prints_its_traceback_once_naming_its_ranks(session: Session) -> None:
    red = session.steps["red"]
    assert red.returncode == 1, session.text("red")
    block = red.stdout.split(f"FAILED {CELL}\n", 1)[1].split("\n\n", 1)[0]
    assert block.count("Traceback (most recent call last):") == 1, block
    assert "  ranks 1-3: AssertionError: Tensor-likes are not close!" in block
    assert str(session.cases) in block and "torch.testing.assert_close(mine, serial)" in block
    assert "cpmatrix/worker" not in block  # its own frames are hidden
    # the evidence by rank, the failing ranks first; rank 0's 0.0 is labelled
    assert "  evidence ranks 1-3 (failed): max_abs_err = 1.0\n" in block + "\n"
    assert "  evidence rank 0: max_abs_err = 0.0" in block
    assert f"  repro: cpmatrix repro '{CELL}'" in block
    lines = red.stdout.splitlines()
    head = lines.index("target         cells  passed  failed  skipped   time")
    assert lines[head + 1].split()[:5] == ["allreduce_sum", "4", "2", "2", "0"]
    slowest = lines[lines.index("==== slowest 3 cells ====") + 1:][:3]
    assert len(slowest) == 3 and all(re.match(r" +\d+\.\d\d s  \S", ln) for ln in slowest)


def test_the_repro_line_is_in_the_junit_and_the_html(session: Session) -> None:
    line = f"cpmatrix repro '{CELL}'"
    props = {c.name: c.properties for c in read_report(session.root / "red-report.xml")}
    assert props[CELL]["repro"] == line
    assert "repro" not in props["tp_mlp[layer,1x2,fp64,autocast=off,reference]@cpu"]
    page = (session.root / "red-report.html").read_text()
    assert "$ <code>cpmatrix repro &#x27;" + CELL + "&#x27;</code>" in page
    assert '<table class="times" id="worlds">' in page and '<section id="history">' in page


def test_the_pasted_line_reruns_the_cell(session: Session) -> None:
    pasted = session.steps["pasted"]
    assert pasted.returncode == 1, session.text("pasted")
    assert f"repro: cpmatrix repro '{CELL}' --runner local" in pasted.stdout
    assert "==== 1 cells: 1 failed" in pasted.stdout
    assert "ranks 1-3: AssertionError" in pasted.stdout


def test_repro_failed_reruns_the_last_runs_failures(session: Session) -> None:
    failed = session.steps["failed"]
    assert failed.returncode == 1, session.text("failed")
    assert failed.stdout.startswith("repro: 2 cells in one world: ")
    assert {CELL, CELL32} <= set(re.findall(r"^FAILED (\S+)$", failed.stdout, re.MULTILINE))


def test_repro_failed_is_not_confused_by_later_runs_of_other_cells(session: Session) -> None:
    assert session.steps["other"].returncode == 0, session.text("other")
    assert session.steps["none"].returncode == 3, session.text("none")
    later = session.steps["failed-later"]
    assert later.returncode == 1, session.text("failed-later")
    assert later.stdout.startswith("repro: 2 cells in one world: ")
    assert {CELL, CELL32} <= set(re.findall(r"^FAILED (\S+)$", later.stdout, re.MULTILINE))


def test_show_prints_the_failure(session: Session) -> None:
    shown = session.steps["show"]
    assert shown.returncode == 0, session.text("show")
    out = shown.stdout
    assert out.startswith(f"FAILED {CELL}\n")
    assert "kind: error   rank(s): 1,2,3" in out and "ranks 1-3: AssertionError" in out
    assert "evidence ranks 1-3 (failed): max_abs_err = 1.0" in out
    for rank in range(4):
        assert f"log rank {rank}: {session.root / 'out' / 'cells'}" in out
    assert f"repro: cpmatrix repro '{CELL}'" in out


def test_the_json_documents_validate_against_the_schema(session: Session) -> None:
    docs: dict[str, Any] = {}
    for name in ("show-json", "gate-json", "xff", "merge-json"):
        proc = session.steps[name]
        docs[name] = json.loads(proc.stdout)  # stdout is one document, nothing else
        jsonschema.validate(docs[name], SCHEMA)
    assert docs["show-json"]["result"]["repro"] == f"cpmatrix repro '{CELL}'"
    gate = docs["gate-json"]
    assert gate["exit_code"] == session.steps["gate-json"].returncode == 1
    assert {r["check"] for r in gate["reasons"]} == {"status"}
    merged = docs["merge-json"]
    assert merged["cells"] == 5 and merged["exit_code"] == 1


def test_x_stops_at_the_first_failure_and_failed_first_runs_it_first(session: Session) -> None:
    proc = session.steps["xff"]
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    first = next(ln for ln in proc.stderr.splitlines() if ln.startswith("[1/5]"))
    assert first.split()[1] == "FAILED" and "[unit,2x2," in first
    statuses = [c["status"] for c in doc["cells"]]
    assert statuses.count("failed") == 1 and statuses.count("interrupted") >= 3
    assert "failed first: 2 cells that failed in the last recorded run" in proc.stderr
    unrun = "not run: the run stopped after the first failure (-x)"
    assert all(c["message"] == unrun for c in doc["cells"] if c["status"] == "interrupted")


def test_a_gate_never_passes_a_run_that_x_stopped(session: Session) -> None:
    gate = session.steps["gate-x"]
    assert gate.returncode == 1, session.text("gate-x")
    doc = json.loads(gate.stdout)
    unrun = [r for r in doc["reasons"]
             if "not run: the run stopped after the first failure (-x)" in r["detail"]]
    interrupted = sum(1 for c in json.loads(session.steps["xff"].stdout)["cells"]
                      if c["status"] == "interrupted")
    assert len(unrun) == interrupted >= 3, doc["reasons"]


def test_version_and_did_you_mean(session: Session) -> None:
    assert session.cli("v", "--version").stdout == f"cpmatrix {__version__}\n"
    typo = session.cli("typo", "list", "--platfrom", "cpu")
    assert typo.returncode == 2 and "did you mean '--platform'?" in typo.stderr
    near = session.cli("near", "list", "-k", "allreduce_sun")
    assert near.returncode == 3
    assert "-k word 'allreduce_sun' matches no cell (did you mean 'allreduce_sum'?)" \
        in near.stderr
    torch_name = session.cli("float32", "list", "-k", "float32")
    assert torch_name.returncode == 3
    assert "did you mean 'fp32'? torch's float32 is fp32 here" in torch_name.stderr


def test_a_missing_case_and_the_constraint_count(session: Session) -> None:
    text = session.matrix.read_text()
    try:
        session.matrix.write_text(text.replace("case: cases:tp_mlp", "case: cases:tp_mpl"))
        missing = session.cli("missing", "list")
        line = next(n for n, ln in enumerate(text.splitlines(), 1) if "cases:tp_mlp" in ln)
        assert missing.returncode == 2
        assert missing.stderr.startswith(f"error: {session.matrix}:{line}:")
        assert f"{session.cases} defines no 'tp_mpl' (did you mean 'tp_mlp'?)" in missing.stderr
        session.matrix.write_text(text.replace("dtype: [fp64, fp32]}",
                                               "dtype: [fp64, fp32], autocast: [off, on]}"))
        counted = session.cli("constraint", "list")
        assert counted.returncode == 0, counted.stderr
        assert "4 by constraint autocast-needs-reduced-precision" in counted.stderr
    finally:
        session.matrix.write_text(text)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")
def test_the_html_in_chromium(session: Session, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    page = session.root / "xff-report.html"  # out/ is the later runs' now
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "newcomer-report.png"  # the test's artifact: never committed
    proc = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1400,1800",
                           page.as_uri()], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=False).stdout
    assert 'data-ready="1"' in dom  # the page's script ran
    assert f"cpmatrix repro '{CELL}'" in dom.replace("&#x27;", "'").replace("&#39;", "'")
    assert dom.count('<svg class="hist"') == 2  # a plot per target


def test_bash_completes_a_cell_id_across_its_word_breaks(session: Session) -> None:
    script = session.cli("completion", "completion", "bash").stdout
    line = "cpmatrix repro allreduce_sum[unit,2x2,fp64,autocast=o"
    probe = (f"{script}\nCOMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}\n"
             "COMP_WORDS=(cpmatrix repro allreduce_sum[unit,2x2,fp64,autocast = o); "
             "COMP_CWORD=4\n_cpmatrix_complete\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                          cwd=session.root, timeout=60, check=False, env=_with_cli_on_path())
    assert done.returncode == 0, done.stderr
    # bash keeps the text before the last '=': the reply is the rest of the id
    assert done.stdout.split() == ["off,reference]@cpu"], done.stdout + done.stderr
    commands = subprocess.run(
        ["bash", "-c", f"{script}\nCOMP_LINE='cpmatrix re'; COMP_POINT=11; "
         "COMP_WORDS=(cpmatrix re); COMP_CWORD=1\n_cpmatrix_complete\n"
         "printf '%s\\n' \"${COMPREPLY[@]}\"\n"], capture_output=True, text=True,
        cwd=session.root, timeout=60, check=False, env=_with_cli_on_path())
    assert sorted(commands.stdout.split()) == ["report", "repro"]


def _with_cli_on_path() -> dict[str, str]:
    """This environment, with the interpreter's ``cpmatrix`` script first on PATH (the
    completion script calls ``cpmatrix completion --ids``)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
            f"{os.environ.get('PATH', '')}"}
