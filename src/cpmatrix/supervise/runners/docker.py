"""Run a world in a Docker container with no network but loopback, from a pinned image.

``docker run --rm --init --network=none`` with the launch's directories bind-mounted at
their host paths (read-only or read-write), so the files a worker writes are where the
supervisor reads them. The image (``docker/<platform>.Dockerfile``) brings its own Python
with torch but not cpmatrix: the runner mounts the directory holding the ``cpmatrix``
package read-only and puts it on ``PYTHONPATH``.

How a launch changes on its way into the container:

- ``argv[0]``: a host interpreter (``/any/path/python``, ``python3``, ``python3.11``)
  becomes ``python3``, the image's venv interpreter; ``torchrun`` becomes
  ``python3 -m torch.distributed.run``. Any other command runs as given.
- read-only mounts: the host's Python environments (the running interpreter's prefixes,
  any folder holding ``pyvenv.cfg`` or ``bin/python3``) are left out; the image has its
  own, and host packages must not leak in.
- environment: every variable is passed with ``-e NAME`` (the value travels in the docker
  client's environment, never in argv), except host paths that mean nothing in the image
  (``PATH``, ``VIRTUAL_ENV``, ``LD_LIBRARY_PATH``, ``CUDA_HOME``, ``PYTHONHOME``); for
  those the image's own values apply.
- processes: ``--pid=host``, because the supervisor checks, signals and kills ranks by
  the pids workers report (a container pid would name some host process); ``--init``
  still forwards the client's signals. Killing the client does not stop the container:
  ``cleanup()`` removes it by name.
- cuda: ``--gpus all``, or ``--gpus "device=2,3"`` for ``launch.devices`` with
  ``CUDA_VISIBLE_DEVICES`` renumbered to ``0,1`` (the container sees only those).

Example::

    >>> from cpmatrix.supervise.runners.base import Launch
    >>> container_argv(("/venv/bin/python", "-m", "torch.distributed.run", "w.py"))
    ['python3', '-m', 'torch.distributed.run', 'w.py']
    >>> container_argv(("torchrun", "--nproc-per-node=2", "w.py"))
    ['python3', '-m', 'torch.distributed.run', '--nproc-per-node=2', 'w.py']
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from cpmatrix.matrix.schema import IMAGE_FORMS
from cpmatrix.paths import IMPORT_ROOT
from cpmatrix.supervise.runners import image as _image
from cpmatrix.supervise.runners.base import Launch
from cpmatrix.supervise.runners.sandbox import CELL_HOSTNAME, hosts_file
from cpmatrix.worker.watchdog import watch_argv

__all__ = ["DockerRunner", "container_argv", "docker_run_argv"]

#: Host-specific variables whose host value is wrong inside the image.
_HOST_ONLY: Final = frozenset(
    {"PATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_HOME", "PYTHONHOME", "PYTHONEXECUTABLE"}
)
#: Variables the docker client itself reads; they reach the client, never the container.
_CLIENT_VARS: Final = (
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "DOCKER_API_VERSION",
)
_PYTHON: Final = re.compile(r"python(3(\.\d+)?)?")
#: The directory holding the cpmatrix package (src/ in a checkout).
_PACKAGE_DIR: Final = IMPORT_ROOT  # the folder holding the cpmatrix package


def container_argv(argv: Iterable[str]) -> list[str]:
    """``argv`` with a host interpreter or ``torchrun`` replaced by the image's ``python3``."""
    args = list(argv)
    if not args:
        raise ValueError("a launch needs a command (argv is empty)")
    head = os.path.basename(args[0])
    if _PYTHON.fullmatch(head):
        return ["python3", *args[1:]]
    if head == "torchrun":
        return ["python3", "-m", "torch.distributed.run", *args[1:]]
    return args


def _is_python_env(path: Path) -> bool:
    host_prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return (
        str(path) in host_prefixes
        or (path / "pyvenv.cfg").is_file()
        or (path / "bin" / "python3").exists()
    )


def _under(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _mount(path: str, *, readonly: bool) -> list[str]:
    # --mount, not -v: it fails on a missing source instead of creating a root-owned
    # empty directory there. Its value is comma-separated, so a comma cannot be quoted.
    if "," in path:
        raise ValueError(f"cannot bind-mount {path!r} into a container: it contains a comma")
    spec = f"type=bind,source={path},target={path}"
    return ["--mount", f"{spec},readonly" if readonly else spec]


def docker_run_argv(
    launch: Launch,
    *,
    image: str,
    docker: str = "docker",
    gpus: bool = False,
    hosts: str | None = None,
    user: str | None = None,
    supervisor: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The ``docker run`` argv for ``launch`` and the container's environment (pure but
    for ``supervisor``: the pid whose death ends the container, see
    :mod:`cpmatrix.worker.watchdog`; its start time is read from ``/proc``).

    Example::

        >>> launch = Launch(argv=("/h/bin/python", "-V"), env={"TZ": "UTC", "PATH": "/h/bin"},
        ...                 cwd="/src", readonly=("/src",), writable=("/out",), name="w0")
        >>> argv, env = docker_run_argv(launch, image="img:1")
        >>> " ".join(argv[:7]), argv[-3:]
        ('docker run --rm --init --network=none --name w0', ['img:1', 'python3', '-V'])
        >>> "type=bind,source=/out,target=/out" in argv, "-e" in argv, sorted(env)
        (True, True, ['PYTHONPATH', 'TZ'])
    """
    mounts: dict[Path, bool] = {}  # path -> read-only
    for raw in launch.readonly:
        path = Path(os.path.abspath(raw))
        if not _is_python_env(path):
            mounts[path] = True
    for raw in launch.writable:
        mounts[Path(os.path.abspath(raw))] = False  # writable wins for the same path

    env = {k: v for k, v in launch.env.items() if k not in _HOST_ONLY}
    # The image has no cpmatrix: mount the package (read-only) unless a read-only mount
    # already holds it, and put its parent on PYTHONPATH.
    package = _PACKAGE_DIR / "cpmatrix"
    if not _under(package, [p for p, ro in mounts.items() if ro]):
        mounts[package] = True
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(_PACKAGE_DIR) not in paths:
        paths.insert(0, str(_PACKAGE_DIR))
    env["PYTHONPATH"] = os.pathsep.join(paths)

    gpu_args: list[str] = []
    if gpus and launch.devices:
        # The quotes are part of the value: docker reads --gpus as CSV, so without them
        # "device=0,1" would be two fields. Inside, the chosen GPUs are numbered from 0.
        gpu_args = ["--gpus", '"device={}"'.format(",".join(map(str, launch.devices)))]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(launch.devices)))
    elif gpus:
        gpu_args = ["--gpus", "all"]

    argv = [docker, "run", "--rm", "--init", "--network=none", "--name", launch.name]
    # The host's pid namespace: the supervisor checks, signals (SIGUSR1 for stacks) and kills
    # ranks by the pid each worker reports; a container pid would name a host process.
    argv += ["--pid=host", "--hostname", CELL_HOSTNAME]
    if user:
        argv += ["--user", user]
    # NCCL's intra-node transport lives in /dev/shm; docker's default 64 MB is too small.
    argv += ["--shm-size=1g", "--workdir", launch.cwd, *gpu_args]
    if hosts:
        # Docker's own /etc/hosts does not name ::ffff:127.0.0.1, and c10d's reverse
        # look-up of it then logs a warning per rank (see sandbox._HOSTS).
        argv += ["--mount", f"type=bind,source={hosts},target=/etc/hosts,readonly"]
    for path in sorted(mounts, key=lambda p: (len(p.parts), str(p))):
        argv += _mount(str(path), readonly=mounts[path])
    for key in sorted(env):
        argv += ["-e", key]  # NAME only: the value comes from the client's environment
    command = container_argv(launch.argv)
    if supervisor is not None:
        # Killing the client leaves a container running: the watchdog ends it when
        # cpmatrix is gone, even after a SIGKILL that no handler sees.
        command = watch_argv("python3", supervisor, command)
    argv += [image, *command]
    return argv, env


def _client_env(container_env: Mapping[str, str], launch_env: Mapping[str, str]) -> dict[str, str]:
    env = dict(container_env)
    if "PATH" in launch_env:
        # For the client only (credential helpers); PATH is never passed with -e.
        env["PATH"] = launch_env["PATH"]
    env.update({k: os.environ[k] for k in _CLIENT_VARS if k in os.environ})
    return env


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


class DockerRunner:
    """The world's launcher in ``docker run --network=none`` from the platform's image.

    ``image`` defaults to ``cpmatrix-<flavor>:<tag>`` for the platform's Dockerfile
    (``image:`` in the matrix, relative to the matrix file; ``<flavor>.Dockerfile`` with
    ``requirements-<flavor>.txt`` beside it; see :mod:`cpmatrix.supervise.runners.image`;
    ``docker/build-image.sh <flavor>`` builds it).

    Example::

        >>> runner = DockerRunner(image="cpmatrix-cpu:dev")
        >>> runner.name, runner.image
        ('docker', 'cpmatrix-cpu:dev')
    """

    name = "docker"
    #: Ranks run in the host's pid namespace, so their reported pids may be signalled.
    shares_pid_namespace = True
    #: The image's files beside the bound folders (covered by the image id).
    private_files = True

    def __init__(
        self, *, image: str | None = None, dockerfile: Path | None = None,
        device: str = "cpu", docker: str | None = None,
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"docker device must be 'cpu' or 'cuda', not {device!r}")
        self.device = device
        self.dockerfile = dockerfile
        self.docker = docker or shutil.which("docker") or "docker"
        self._image = image
        self._image_id: str | None = None

    @property
    def flavor(self) -> str:
        """The image's name part: ``cpu`` for ``cpu.Dockerfile`` (or ``cpmatrix-cpu:...``)."""
        if self.dockerfile is not None:
            return self.dockerfile.name.removesuffix(".Dockerfile")
        name = (self._image or "").partition(":")[0]
        return name.removeprefix("cpmatrix-") if name.startswith("cpmatrix-") else "?"

    @property
    def image(self) -> str:
        """The image reference (named from the platform's Dockerfile on first use)."""
        if self._image is None:
            if self.dockerfile is None:
                raise ValueError("the platform declares no image")
            self._image = _image.image_ref(self.flavor, docker_dir=self.dockerfile.parent,
                                           docker=self.docker)
        return self._image

    def _docker(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.docker, *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    def unavailable(self) -> str | None:
        if shutil.which(self.docker) is None:
            return "the docker CLI is not installed (apt-get install -y docker.io)"
        try:
            version = self._docker("version", "--format", "{{.Server.Version}}", timeout=10)
        except subprocess.TimeoutExpired:
            return "the Docker engine does not answer within 10 s (start: docker/start-dockerd.sh)"
        if version.returncode != 0:
            return (
                "the Docker engine is not running (start it as root: docker/start-dockerd.sh): "
                + _last_line(version.stderr)
            )
        try:
            image = self.image
        except (OSError, ValueError) as exc:
            return f"no image to run: {exc}; a platform's image: is {IMAGE_FORMS}"
        self._image_id = _image.local_image_id(image, docker=self.docker)
        if self._image_id is None:
            if self.dockerfile is None:
                # The user's own image: cpmatrix never pulls during a run (no registry may
                # be reachable, and a pull would make the run depend on a mutable tag).
                return (f"image {image} is not on this host: pull it first (docker pull "
                        f"{image}) or build and tag it (docker build -t {image} ...); it "
                        "needs python3 with torch, cpmatrix is mounted from the host")
            how = "docker/make-base.sh && " if self.flavor == "cpu" else ""
            return f"image {image} not found; build it: {how}docker/build-image.sh {self.flavor}"
        if self.device == "cuda" and shutil.which("nvidia-container-cli") is None:
            return "--gpus needs the NVIDIA Container Toolkit (nvidia-container-cli not found)"
        return None

    def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
        for path in launch.writable:
            os.makedirs(path, exist_ok=True)
        argv, container_env = docker_run_argv(
            launch,
            image=self.image,
            docker=self.docker,
            gpus=self.device == "cuda",
            hosts=hosts_file(),
            # The caller's ids: files in the output folder belong to whoever ran cpmatrix.
            user=f"{os.getuid()}:{os.getgid()}",
            supervisor=os.getpid(),
        )
        return argv, _client_env(container_env, launch.env)

    def identity(self) -> dict[str, str]:
        if self._image_id is None:
            self._image_id = _image.local_image_id(self.image, docker=self.docker)
        if self._image_id is None:
            raise RuntimeError(f"image {self.image} not found; see DockerRunner.unavailable()")
        return {"runner": "docker", "image": self.image, "image_id": self._image_id}

    def cleanup(self, launch: Launch) -> None:
        # Killing the client does not stop the container. `rm --force` kills and removes
        # it; "no such container" (already gone, or --rm got there first) is success.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self._docker("rm", "--force", launch.name, timeout=60)
