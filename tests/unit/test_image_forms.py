"""A platform's ``image:``: a Dockerfile cpmatrix builds, or an image reference the user
built or pulled (issue 25); anything else is a spec error naming the allowed forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmatrix.errors import SpecError
from cpmatrix.matrix.load import load_matrix
from cpmatrix.matrix.schema import image_form
from cpmatrix.supervise.runners import get_runner
from cpmatrix.supervise.runners.docker import DockerRunner


@pytest.mark.parametrize(("value", "form"), [
    ("../docker/cpu.Dockerfile", "dockerfile"),
    ("cpu.Dockerfile", "dockerfile"),
    ("images/Dockerfile", "dockerfile"),
    ("myproject", "reference"),
    ("myproject:dev", "reference"),
    ("myteam/parity:2026-12", "reference"),
    ("localhost:5000/parity:1", "reference"),
    ("registry.example.com/ml/parity:v1.2_rc-3", "reference"),
    ("ghcr.io/team/parity@sha256:" + "0123456789abcdef" * 4, "reference"),
    ("ghcr.io/team/parity:1@sha256:" + "f" * 64, "reference"),
    ("Parity:1", None),                 # upper case in a repository name
    ("team//parity", None),
    ("parity:", None),
    ("parity:-x", None),
    ("parity@sha256:abc", None),        # a digest too short to be one
    ("a b", None),
    ("", None),
])
def test_image_forms(value: str, form: str | None) -> None:
    assert image_form(value) == form


def _matrix(tmp_path: Path, image: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text("version: 1\nplatforms:\n"
                    f"  cpu: {{backend: gloo, device: cpu, image: '{image}'}}\n"
                    "targets:\n  - {name: t, case: 'm:f', level: unit, axes: {mesh: [1x1]}}\n")
    return path


def test_an_image_that_is_neither_form_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        load_matrix(_matrix(tmp_path, "My Image"))
    text = str(err.value)
    assert "m.yaml:3" in text and "platforms.cpu.image" in text
    assert "neither a Dockerfile nor an image reference" in text
    assert "NAME[:TAG]" in text and "<flavor>.Dockerfile" in text


def test_a_reference_runs_that_image_and_a_dockerfile_builds_one(tmp_path: Path) -> None:
    ref = load_matrix(_matrix(tmp_path, "myteam/parity:2026-12")).platform("cpu")
    runner = get_runner("docker", ref, tmp_path)
    assert isinstance(runner, DockerRunner)
    assert runner.image == "myteam/parity:2026-12" and runner.dockerfile is None
    built = load_matrix(_matrix(tmp_path, "docker/cpu.Dockerfile")).platform("cpu")
    runner = get_runner("docker", built, tmp_path)
    assert isinstance(runner, DockerRunner)
    assert runner.dockerfile == (tmp_path / "docker" / "cpu.Dockerfile").resolve()


def test_a_missing_user_image_says_how_to_get_it() -> None:
    runner = DockerRunner(image="myteam/never-built:1")
    reason = runner.unavailable()
    if reason is not None and ("not installed" in reason or "engine" in reason):
        pytest.skip(f"needs a Docker engine: {reason}")
    assert reason is not None
    assert "docker pull myteam/never-built:1" in reason
    assert "docker build -t myteam/never-built:1" in reason
    assert "pass image=NAME" not in reason
