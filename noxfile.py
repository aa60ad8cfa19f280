"""Nox sessions for cpmatrix, generated from ``matrix/``.

    nox -l                                  # list sessions
    nox -s parity-cpu                       # the CPU parity matrix (docker > sandbox > local)
    nox -s parity-cpu -- -k ring_attention  # pass a selection through
    nox -s parity-cuda                      # on a GPU host (exit 2 at once without one)
    nox -s tests lint spill mutants report gate
    nox -s "compat(triton='3.9.0')"         # the kernel path and spill gate on one Triton

Every session but ``compat`` and ``mutation`` runs in the current environment
(``venv_backend="none"``): cpmatrix and torch are installed once by ``.ci/install`` and never
reinstalled per session. ``compat`` is parametrized over the Triton versions pyproject's
``kernels`` extra admits (3.6.0, 3.7.1, 3.8.0, 3.9.0: the newest patch of each minor release
on the index): each builds its own virtualenv with torch 2.13.0 and that Triton, then runs
the kernel-path cells, the spill gate and the kernel tests there. ``mutation`` builds its
own virtualenv too (mutmut and its dependencies stay out of the working environment).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox
import yaml

ROOT = Path(__file__).parent
#: The matrix the sessions come from; CPMATRIX_MATRIX points them at another one.
MATRIX = Path(os.environ.get("CPMATRIX_MATRIX", ROOT / "matrix" / "parity.yaml")).resolve()
nox.options.sessions = ["parity-cpu"]
nox.options.default_venv_backend = "none"
nox.options.error_on_missing_interpreters = False


def _platforms() -> dict[str, dict[str, object]]:
    """Platform name -> spec, read from the matrix (safe_load; the CLI validates fully)."""
    with open(MATRIX, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    platforms = data.get("platforms") or {}
    return {str(k): dict(v) for k, v in platforms.items()}


def _cuda_devices() -> int:
    from cpmatrix.plan.devices import visible_cuda_devices

    return visible_cuda_devices()


def _choose_runner(platform: str) -> tuple[str, str]:
    """docker when an engine answers (and the image is built), else sandbox, else local."""
    from cpmatrix.matrix.load import load_matrix
    from cpmatrix.supervise.runners import resolve_runner

    runner, why = resolve_runner("auto", load_matrix(MATRIX).platform(platform), MATRIX.parent)
    return runner.name, why


def _out(name: str) -> str:
    return str(ROOT / "out" / name)


def _make_parity_session(platform: str, spec: dict[str, object]) -> None:
    device = spec.get("device", "cpu")

    @nox.session(name=f"parity-{platform}", venv_backend="none")
    def parity(session: nox.Session) -> None:
        # With --scheduler slurm the GPUs are the nodes', not this host's.
        on_slurm = "slurm" in session.posargs or "--scheduler=slurm" in session.posargs
        if device == "cuda" and not on_slurm and _cuda_devices() == 0:
            session.log(f"parity-{platform}: no CUDA device is visible on this machine; "
                        f"check the plan with: cpmatrix run --platform {platform} --dry-run")
            sys.exit(2)
        runner, why = _choose_runner(platform)
        session.log(f"runner: {runner} ({why})")
        out = _out(f"parity-{platform}")
        session.run("cpmatrix", "run", "--matrix", str(MATRIX), "--platform", platform,
                    "--runner", runner, "--out", out, *session.posargs, external=True)
        session.log(f"merged report: {out}/report.xml, html: {out}/report.html")

    parity.__doc__ = (f"Run the {platform} parity matrix ({spec.get('backend')}, "
                      f"{device}); extra args go to `cpmatrix run`.")


for _name, _spec in _platforms().items():
    _make_parity_session(_name, _spec)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run cpmatrix's own test-suite (pytest)."""
    session.run("python", "-m", "pytest", "-q", *session.posargs, external=True)


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff check (src, tests, benchmarks) and mypy --strict on src/cpmatrix."""
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py", external=True)
    session.run("mypy", external=True)


@nox.session(venv_backend="none")
def spill(session: nox.Session) -> None:
    """Triton PTX register-spill gate for every declared kernel config (no GPU needed)."""
    session.run("cpmatrix", "spill", "--matrix", str(MATRIX), "--out", _out("spill"),
                *session.posargs, external=True)


@nox.session(venv_backend="none")
def mutants(session: nox.Session) -> None:
    """Run every CPU cell once per declared mutant; a surviving mutant fails."""
    session.run("cpmatrix", "run", "--matrix", str(MATRIX), "--platform", "cpu", "--mutants",
                "--out", _out("mutants"), *session.posargs, external=True)


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """Render out/parity-cpu/report.xml as a self-contained report.html."""
    out = session.posargs[0] if session.posargs else _out("parity-cpu")
    session.run("cpmatrix", "report", "--report", out, external=True)


@nox.session(venv_backend="none")
def gate(session: nox.Session) -> None:
    """Apply the release gate (matrix/gates.yaml) to out/parity-cpu/report.xml."""
    args = session.posargs or ["--policy", "release", "--report",
                               _out("parity-cpu") + "/report.xml"]
    session.run("cpmatrix", "gate", *args, external=True)


#: The Triton versions the kernel path is tested with: the newest patch of every minor
#: release on the package index from 3.6 (the pin of ``.ci/install``) on. pyproject's
#: ``kernels`` range is exactly these; tests/e2e/test_noxfile.py holds the two together.
TRITON_VERSIONS = ["3.6.0", "3.7.1", "3.8.0", "3.9.0"]


@nox.session(venv_backend="virtualenv")
@nox.parametrize("triton", TRITON_VERSIONS)
def compat(session: nox.Session, triton: str) -> None:
    """The kernel path (parity cells, spill gate, kernel tests) on one Triton version."""
    # torch first and pinned: torch==2.13.0 is the CPU wheel on these machines, and a
    # resolver left to itself may pull a multi-GB CUDA build.
    session.install("torch==2.13.0", "numpy", f"triton=={triton}")
    # The kernels extra re-resolves triton: a constraint keeps this session's version,
    # and pip fails here if pyproject's range does not admit it.
    pins = Path(session.create_tmp()) / "constraints.txt"
    pins.write_text(f"torch==2.13.0\ntriton=={triton}\n", encoding="utf-8")
    session.install("-c", str(pins), "-e", ".[dev,kernels]")
    session.run("python", "-c", "import torch, triton; "
                "print(f'torch {torch.__version__}, triton {triton.__version__}')")
    out = Path(session.create_tmp())
    # Every kernel-path parity cell of the CPU matrix (meshes 1x1 to 2x3), fresh: a cached
    # pass from another Triton would prove nothing.
    session.run("cpmatrix", "run", "--matrix", str(MATRIX), "--platform", "cpu",
                "--runner", "local", "-k", "kernel and not spill", "--no-cache",
                "--out", str(out / "kernel"), "--plain", *session.posargs)
    session.run("cpmatrix", "spill", "--matrix", str(MATRIX), "--no-cache",
                "--out", str(out / "spill"), "--plain")
    # The spill measurement's and the kernels' own tests; the world test of
    # test_suite_kernels.py is left out: it runs a subset of the cells above.
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "tests/e2e/test_spill.py", "tests/suite/test_suite_kernels.py", "--deselect",
                "tests/suite/test_suite_kernels.py::"
                "test_layer_norm_backward_cells_pass_on_real_worlds")


@nox.session(venv_backend="virtualenv", reuse_venv=True)
def mutation(session: nox.Session) -> None:
    """Mutation-test the verdict core with mutmut against its fast tests; score per module.

    Extra args go to tools/mutation_score.py, e.g. ``-- --only parity --fail-under 90``.
    """
    # torch first and pinned: on the CPU-only machines 2.13.0 is the CPU wheel on disk
    session.install("torch==2.13.0", "numpy")
    session.install("-e", ".[dev]")
    session.run("python", "tools/mutation_score.py", *session.posargs)
