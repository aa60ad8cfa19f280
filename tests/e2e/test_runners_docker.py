"""The docker runner and its image names: command lines (pure) and real containers.

Tests marked ``docker`` need a running engine and the cpu image (CI runs
docker/start-dockerd.sh, docker/make-base.sh and docker/build-image.sh first); they skip
only when no engine answers, and fail when the engine runs but the image is missing.
Nothing here sends traffic anywhere but loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import runner_probes as probes
from cpmatrix.kinds.world.job import free_port
from cpmatrix.supervise.runners import Launch, get_runner, image
from cpmatrix.supervise.runners.docker import DockerRunner, container_argv, docker_run_argv
from runner_probes import PROBE, SECRET, WORLD

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def make_launch(tmp_path: Path, argv: tuple[str, ...], *, name: str) -> Launch:
    """The shared launch, with the host's Python announced as a virtualenv (it must not
    reach the container)."""
    return probes.make_launch(tmp_path, argv, name=name, source={"VIRTUAL_ENV": sys.prefix})


def unique_name(tag: str) -> str:
    return f"cpmatrix-test-{tag}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


# ----------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (("/home/dev/.pyenv/versions/3.11.7/bin/python", "-V"), ["python3", "-V"]),
        (("/venv/bin/python3.11", "x.py"), ["python3", "x.py"]),
        (("python3", "-m", "m"), ["python3", "-m", "m"]),
        (("torchrun", "w.py"), ["python3", "-m", "torch.distributed.run", "w.py"]),
        (("/usr/bin/env", "true"), ["/usr/bin/env", "true"]),
        (("/bin/pythonista",), ["/bin/pythonista"]),
    ],
)
def test_container_argv(argv: tuple[str, ...], expect: list[str]) -> None:
    assert container_argv(argv) == expect


def test_run_argv_shape(tmp_path: Path) -> None:
    launch = make_launch(tmp_path, (sys.executable, "-V"), name="w0")
    argv, env = docker_run_argv(launch, image="img:1", docker="docker", user="0:0")
    assert argv[:2] == ["docker", "run"]
    for flag in ("--rm", "--init", "--network=none", "--pid=host"):
        assert flag in argv
    assert flag_values(argv, "--name") == ["w0"]
    assert flag_values(argv, "--workdir") == [str(ROOT)]
    assert argv[-3:] == ["img:1", "python3", "-V"]
    mounts = flag_values(argv, "--mount")
    out, src = tmp_path / "out", tmp_path / "src"
    assert f"type=bind,source={out},target={out}" in mounts
    assert f"type=bind,source={src},target={src},readonly" in mounts
    assert f"type=bind,source={ROOT},target={ROOT},readonly" in mounts
    # The host interpreter stays outside: the image has its own.
    assert not any(f"source={sys.prefix}," in m for m in mounts)
    # The sources hold cpmatrix, so no extra mount; src/ leads PYTHONPATH.
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SRC), str(src)]


def test_env_values_never_in_argv_and_host_paths_stay_out(tmp_path: Path) -> None:
    launch = make_launch(tmp_path, ("python3", "-V"), name="w0")
    assert SECRET not in launch.env.values()  # the allow-list already dropped it
    argv, env = docker_run_argv(launch, image="img:1")
    for key, value in env.items():
        assert f"{key}={value}" not in argv
    assert sorted(flag_values(argv, "-e")) == sorted(env)
    for key in ("PATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH"):
        assert key not in env  # the image's own values apply
    assert env["TZ"] == "UTC" and env["GLOO_SOCKET_IFNAME"] == "lo"


def test_package_is_mounted_when_no_readonly_folder_holds_it(tmp_path: Path) -> None:
    launch = Launch(argv=("python3",), env={}, cwd="/", writable=(str(tmp_path),))
    argv, env = docker_run_argv(launch, image="img:1")
    package = SRC / "cpmatrix"
    assert f"type=bind,source={package},target={package},readonly" in flag_values(argv, "--mount")
    assert env["PYTHONPATH"] == str(SRC)


@pytest.mark.parametrize(
    ("devices", "gpus_value", "visible"),
    [((), "all", None), ((2, 3), '"device=2,3"', "0,1")],
)
def test_gpus(devices: tuple[int, ...], gpus_value: str, visible: str | None) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3"} if devices else {}
    launch = Launch(argv=("python3",), env=env, cwd="/", devices=devices)
    argv, container_env = docker_run_argv(launch, image="img:1", gpus=True)
    assert flag_values(argv, "--gpus") == [gpus_value]
    assert container_env.get("CUDA_VISIBLE_DEVICES") == visible
    argv, _ = docker_run_argv(launch, image="img:1", gpus=False)
    assert "--gpus" not in argv


def test_a_comma_in_a_path_is_refused() -> None:
    launch = Launch(argv=("python3",), env={}, cwd="/", writable=("/tmp/a,b",))
    with pytest.raises(ValueError, match="comma"):
        docker_run_argv(launch, image="img:1")


def test_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="device"):
        DockerRunner(image="x", device="tpu")
    assert isinstance(get_runner("docker"), DockerRunner)


def test_the_platforms_image_is_its_dockerfile_relative_to_the_matrix() -> None:
    from cpmatrix.matrix.load import load_matrix

    matrix = load_matrix(ROOT / "matrix" / "parity.yaml")
    runner = get_runner("docker", matrix.platform("cpu"), ROOT / "matrix")
    assert isinstance(runner, DockerRunner)
    assert runner.dockerfile == ROOT / "docker" / "cpu.Dockerfile" and runner.flavor == "cpu"
    assert get_runner("docker", matrix.platform("cuda"), ROOT / "matrix").device == "cuda"


def test_engine_that_does_not_answer_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = DockerRunner(image="cpmatrix-cpu:any")
    if runner.unavailable() is not None and "not installed" in (runner.unavailable() or ""):
        pytest.skip("no docker CLI here")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/cpmatrix-test.sock")
    reason = runner.unavailable()
    assert reason is not None and "docker/start-dockerd.sh" in reason


def test_missing_cli_is_a_reason() -> None:
    reason = DockerRunner(image="x", docker="no-such-docker-here").unavailable()
    assert reason is not None and "apt-get install -y docker.io" in reason


# ----------------------------------------------------------------------- image names


@pytest.mark.parametrize("field", ["dockerfile", "requirements", "base", "base_id"])
def test_image_tag_changes_with_every_input(field: str) -> None:
    inputs: dict[str, object] = {
        "dockerfile": b"FROM x",
        "requirements": b"torch==2.13.0",
        "base": "x",
        "base_id": "sha256:1",
    }
    first = image.image_tag(**inputs)  # type: ignore[arg-type]
    inputs[field] = b"other" if isinstance(inputs[field], bytes) else "other"
    assert image.image_tag(**inputs) != first  # type: ignore[arg-type]
    assert len(first) == 16 and int(first, 16) >= 0


def test_default_base_comes_from_the_dockerfile() -> None:
    cpu = (ROOT / "docker" / "cpu.Dockerfile").read_text()
    assert image.default_base(cpu) == "cpmatrix-base:bookworm"
    assert image.default_base((ROOT / "docker" / "cuda.Dockerfile").read_text()).startswith(
        "nvidia/cuda:"
    )
    with pytest.raises(ValueError, match="ARG BASE"):
        image.default_base("FROM scratch\n")


def test_image_ref_of_the_checkout() -> None:
    docker_dir = ROOT / "docker"
    # no engine: base id unknown
    ref = image.image_ref("cpu", docker_dir=docker_dir, docker="no-such-docker-here")
    name, tag = ref.split(":")
    assert name == "cpmatrix-cpu" and len(tag) == 16
    assert image.main(["base", "cpu", "--docker-dir", str(docker_dir)]) == 0
    with pytest.raises(FileNotFoundError, match=r"tpu\.Dockerfile"):
        image.image_ref("tpu", docker_dir=docker_dir)


# ----------------------------------------------------------------------------- real


@pytest.fixture(scope="module")
def runner() -> DockerRunner:
    docker = DockerRunner(dockerfile=ROOT / "docker" / "cpu.Dockerfile")
    reason = docker.unavailable()
    if reason is not None and ("not installed" in reason or "engine" in reason):
        pytest.skip(f"docker tests need a running engine: {reason}")
    if reason is not None:
        pytest.fail(f"the engine runs but the runner cannot: {reason}")
    return docker


@pytest.fixture
def container_name() -> Iterator[str]:
    name = unique_name("c")
    yield name
    # Whatever a test left behind (a failed assertion before cleanup) is ours to remove.
    subprocess.run(["docker", "rm", "--force", name], capture_output=True, check=False)


@pytest.mark.docker
def test_identity_is_the_image_id(runner: DockerRunner) -> None:
    ident = runner.identity()
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", runner.image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert ident == {"runner": "docker", "image": runner.image, "image_id": inspected}


@pytest.mark.docker
def test_missing_image_names_the_build_command(runner: DockerRunner, tmp_path: Path) -> None:
    # The project's own image: its tag is named from the Dockerfile and its inputs, so an
    # edited copy names a tag nobody built, and the message gives the build script.
    docker_dir = tmp_path / "docker"
    docker_dir.mkdir()
    for name in ("cpu.Dockerfile", "requirements-cpu.txt"):
        (docker_dir / name).write_text((ROOT / "docker" / name).read_text() + "\n# edited\n")
    reason = DockerRunner(dockerfile=docker_dir / "cpu.Dockerfile").unavailable()
    assert reason is not None and "docker/build-image.sh cpu" in reason, reason
    # A user's own image reference: never pulled during a run; the message says how to get it.
    reason = DockerRunner(image="cpmatrix-cpu:no-such-tag").unavailable()
    assert reason is not None and "docker pull cpmatrix-cpu:no-such-tag" in reason, reason
    assert "docker build -t cpmatrix-cpu:no-such-tag" in reason


@pytest.mark.docker
def test_a_cell_sees_loopback_its_folder_and_nothing_else(
    runner: DockerRunner, tmp_path: Path, container_name: str
) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    probe, out = tmp_path / "src" / "probe.py", tmp_path / "out"
    launch = make_launch(
        tmp_path,
        (sys.executable, str(probe), str(out), str(ROOT), str(hidden)),
        name=container_name,
    )
    probe.write_text(PROBE)
    argv, env = runner.command(launch)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads((out / "probe.json").read_text())
    assert seen["interfaces"] == ["lo"]
    assert seen["write_out"] == "ok"
    assert seen["write_readonly"] == "Read-only file system"
    assert not (ROOT / "probe.txt").exists()
    assert seen["hidden_visible"] is False
    assert seen["secret"] is None and SECRET not in json.dumps(seen["env"])
    assert (seen["env"]["TZ"], seen["env"]["HOME"]) == ("UTC", launch.env["HOME"])
    assert seen["cwd"] == str(ROOT)
    # The image's interpreter, with cpmatrix from the mounted sources.
    assert seen["prefix"] == "/opt/venv"
    assert seen["cpmatrix"] == str(SRC / "cpmatrix" / "__init__.py")
    # Files written inside belong to the caller, at the same path.
    assert (out / "probe.json").stat().st_uid == os.getuid()
    assert seen["pid"] > 1  # the host's pid namespace: the supervisor can signal it


@pytest.mark.docker
@pytest.mark.slow
def test_two_rank_gloo_world(runner: DockerRunner, tmp_path: Path, container_name: str) -> None:
    script = tmp_path / "src" / "world.py"
    argv = (
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0",
        str(script), str(tmp_path / "out"),
    )  # fmt: skip
    launch = make_launch(tmp_path, argv, name=container_name)
    script.write_text(WORLD)
    command, env = runner.command(launch)
    start = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    wall = time.monotonic() - start
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for rank in (0, 1):
        got = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
        assert got == {"sum": 3.0, "world": 2, "interfaces": ["lo"]}
    assert "hostname of the client socket cannot be retrieved" not in output
    print(f"2-rank gloo world in docker: {wall:.1f}s")


def _running(name: str) -> bool:
    done = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Running}}", name],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0 and done.stdout.strip() == "true"


@pytest.mark.docker
def test_cleanup_stops_the_container_the_killed_client_left(
    runner: DockerRunner, tmp_path: Path, container_name: str
) -> None:
    launch = make_launch(
        tmp_path, ("python3", "-c", "import time; time.sleep(300)"), name=container_name
    )
    argv, env = runner.command(launch)
    client = subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _running(container_name) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running(container_name), "the container never started"
        os.killpg(client.pid, signal.SIGKILL)  # what the supervisor does on a hang
        client.wait(timeout=30)
        assert _running(container_name), "killing the client stopped it (cleanup untested)"
        runner.cleanup(launch)
        assert not _running(container_name)
        runner.cleanup(launch)  # already gone: still fine
    finally:
        if client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait()
