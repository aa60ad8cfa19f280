"""Run a world inside a bubblewrap sandbox: loopback-only network, read-only inputs.

The sandbox is built from an empty root: only the system directories a Python process
needs (``/usr``, the ``/bin``-style links, a few files of ``/etc``, ``/sys``) and the
launch's own directories are visible. Sources and the Python environment are bound
read-only, the launch's writable directories read-write, all at their host paths, so
the files a worker writes are where the supervisor reads them.

Example::

    >>> from cpmatrix.supervise.runners.base import Launch
    >>> launch = Launch(argv=("/usr/bin/python3", "-c", "pass"), env={"TZ": "UTC"},
    ...                 cwd="/src", readonly=("/src",), writable=("/out",))
    >>> argv = sandbox_argv(launch, bwrap="/usr/bin/bwrap")
    >>> argv[:2]
    ['/usr/bin/bwrap', '--die-with-parent']
    >>> argv[-7:]
    ['--setenv', 'TZ', 'UTC', '--', '/usr/bin/python3', '-c', 'pass']
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from cpmatrix.supervise.runners.base import Launch

__all__ = ["CELL_HOSTNAME", "SandboxRunner", "hosts_file", "python_roots", "sandbox_argv"]

#: The sandbox's host name and /etc/hosts. c10d's TCPStore listens on a dual-stack socket,
#: so a rank connecting to 127.0.0.1 is seen as ``::ffff:127.0.0.1``; a host /etc/hosts does
#: not name that address, the reverse look-up goes to DNS, which cannot answer in an empty
#: network namespace, and every rank logs "hostname of the client socket cannot be
#: retrieved". With this file every look-up a world makes is answered locally.
#: Also the container host name of the docker runner, which binds the same file.
CELL_HOSTNAME: Final = "cpmatrix-cell"
_HOSTS: Final = "".join(
    f"{address}\t{names}\n"
    for address, names in (
        ("127.0.0.1", f"localhost {CELL_HOSTNAME}"),
        ("::1", f"localhost ip6-localhost ip6-loopback {CELL_HOSTNAME}"),
        ("::ffff:127.0.0.1", CELL_HOSTNAME),
    )
)

#: Namespaces every sandbox gets: a network namespace holding only ``lo``, and private
#: IPC, UTS and cgroup views. Deliberately NOT a pid namespace: the supervisor reads each
#: rank's pid (``os.getpid()`` in the worker) to check liveness, dump stacks (SIGUSR1) and
#: kill a hung rank; in a pid namespace those numbers name unrelated host processes.
#: Teardown needs no namespace: the supervisor kills bwrap's process group and every rank
#: by pid, and --die-with-parent takes the launcher down with bwrap.
_ISOLATION: Final = (
    "--die-with-parent",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    # Run as root, bwrap would keep every capability, and CAP_SYS_ADMIN could remount the
    # read-only binds writable. A cell needs none.
    "--cap-drop",
    "ALL",
    "--hostname",
    CELL_HOSTNAME,
)

#: System directories bound read-only when they exist (symlinks such as Debian's
#: /bin -> usr/bin are recreated as links).
_SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")

#: The parts of /etc a Python process, torch and the CUDA loader read. The rest of /etc
#: (credentials of services, package-manager settings) stays out of the sandbox.
_ETC_FILES: Final = (
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/localtime",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/os-release",
    "/etc/mime.types",
)

#: GPU device nodes that every CUDA process opens, besides /dev/nvidiaN.
_NVIDIA_CONTROL: Final = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)


def _depth(path: str) -> int:
    return len(Path(path).parts)


def python_roots(launch: Launch) -> tuple[str, ...]:
    """What the launch's Python needs to start, bound read-only besides ``launch.readonly``.

    The prefixes of this interpreter and of ``argv[0]`` when it is a path
    (``<prefix>/bin/python``; a venv is useless without the base named in its
    ``pyvenv.cfg``), and the folders of ``LD_LIBRARY_PATH`` and ``CUDA_HOME`` (a CUDA
    install outside /usr). Missing ones are skipped by ``--ro-bind-try``.

    Example::

        >>> launch = Launch(argv=("/opt/py/bin/python3",), env={"CUDA_HOME": "/opt/cuda"}, cwd="/")
        >>> {"/opt/py", "/opt/cuda", sys.prefix} <= set(python_roots(launch))
        True
    """
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    interpreter = Path(launch.argv[0]) if launch.argv else Path()
    if interpreter.is_absolute():
        for path in {interpreter, interpreter.resolve()}:
            prefix = path.parent.parent
            if prefix == Path("/"):
                continue  # /bin/python3 (a link into /usr): never bind the whole host
            roots.add(str(prefix))
            cfg = prefix / "pyvenv.cfg"
            if cfg.is_file():
                for line in cfg.read_text().splitlines():
                    key, _, value = line.partition("=")
                    if key.strip() == "home" and value.strip():
                        roots.add(str(Path(value.strip()).parent))  # home = <base>/bin
    for key in ("LD_LIBRARY_PATH", "CUDA_HOME"):
        roots.update(p for p in launch.env.get(key, "").split(os.pathsep) if os.path.isabs(p))
    return tuple(sorted(roots))


def _gpu_nodes(devices: Iterable[int]) -> list[str]:
    wanted = list(devices)
    if wanted:
        nodes = [f"/dev/nvidia{i}" for i in wanted]
    else:
        nodes = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())
    return [*nodes, *_NVIDIA_CONTROL]


def hosts_file() -> str:
    """A file holding ``_HOSTS``, made once per user and reused (its content never changes)."""
    path = Path(tempfile.gettempdir()) / f"cpmatrix-{os.getuid()}" / "sandbox-hosts"
    if not path.is_file() or path.read_text() != _HOSTS:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Write then rename: a concurrent world never binds a half-written file.
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(_HOSTS)
        os.replace(partial, path)
    return str(path)


def sandbox_argv(
    launch: Launch,
    *,
    bwrap: str = "bwrap",
    gpus: bool = False,
    extra_readonly: Iterable[str] = (),
    hosts: str | None = None,
) -> list[str]:
    """The full ``bwrap ... -- argv`` command line for ``launch`` (pure: touches nothing).

    Mounts are ordered by depth so a writable output folder inside a read-only project
    root is bound on top of it, and everything is bound after ``--tmpfs /tmp`` so
    folders under /tmp (pytest's, for one) stay visible.

    Example::

        >>> launch = Launch(argv=("true",), env={}, cwd="/", writable=("/tmp/o",))
        >>> args = sandbox_argv(launch, bwrap="bwrap")
        >>> args[args.index("--tmpfs") + 1], args[args.index("--bind") + 1]
        ('/tmp', '/tmp/o')
    """
    args: list[str] = [bwrap, *_ISOLATION]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind-try", path, path]
    for path in _ETC_FILES:
        args += ["--ro-bind-try", path, path]
    args += ["--ro-bind-try", hosts or "/etc/hosts", "/etc/hosts"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if gpus:
        for node in _gpu_nodes(launch.devices):
            args += ["--dev-bind-try", node, node]

    binds: dict[str, str] = {}
    for path in (*extra_readonly, *launch.readonly):
        binds[os.path.abspath(path)] = "--ro-bind-try"
    # Writable wins over read-only for the same path: it is the more specific request.
    for path in launch.writable:
        binds[os.path.abspath(path)] = "--bind"
    for path in sorted(binds, key=lambda p: (_depth(p), p)):
        args += [binds[path], path, path]

    args += ["--chdir", launch.cwd, "--clearenv"]
    for key, value in sorted(launch.env.items()):
        args += ["--setenv", key, value]
    # "--" ends bwrap's options, so an argv starting with "-" is never read as one.
    args += ["--", *launch.argv]
    return args


@functools.cache
def _probe(bwrap: str) -> str | None:
    """Start the cheapest sandbox with the real isolation flags; None when it works."""
    try:
        done = subprocess.run(
            [bwrap, *_ISOLATION, "--ro-bind", "/", "/", "--proc", "/proc", "--", "true"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start a sandbox: {exc}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"bubblewrap cannot create namespaces here ({why})"
    return None


class SandboxRunner:
    """The world's launcher inside bubblewrap with a loopback-only network and read-only inputs.

    ``device="cuda"`` also binds the GPU device nodes (those in ``launch.devices``, or
    every /dev/nvidiaN when it is empty).

    Example::

        >>> runner = SandboxRunner()
        >>> runner.name, runner.identity()
        ('sandbox', {'runner': 'sandbox'})
    """

    name = "sandbox"
    #: Ranks run in the host's pid namespace, so their reported pids may be signalled.
    shares_pid_namespace = True
    #: The host's files, read-only (``--ro-bind / /``): the same paths, the same content.
    private_files = False

    def __init__(self, *, bwrap: str | None = None, device: str = "cpu") -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"sandbox device must be 'cpu' or 'cuda', not {device!r}")
        self.device = device
        self.bwrap = bwrap or shutil.which("bwrap") or "bwrap"

    def unavailable(self) -> str | None:
        if not os.path.isabs(self.bwrap) and shutil.which(self.bwrap) is None:
            return "bubblewrap is not installed (apt-get install -y bubblewrap)"
        return _probe(self.bwrap)

    def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
        # The bind mount points must exist before bwrap starts; a writable folder is the
        # world's own, so making it here is the runner's job, not a side effect.
        for path in launch.writable:
            os.makedirs(path, exist_ok=True)
        argv = sandbox_argv(
            launch,
            bwrap=self.bwrap,
            gpus=self.device == "cuda",
            extra_readonly=python_roots(launch),
            hosts=hosts_file(),
        )
        # bwrap itself reads no variable; --clearenv already gives the world launch.env only,
        # and passing the same env keeps bwrap's own environment as clean.
        return argv, dict(launch.env)

    def identity(self) -> dict[str, str]:
        # The sandbox changes what a cell may touch, not what it computes.
        return {"runner": "sandbox"}

    def cleanup(self, launch: Launch) -> None:
        # Nothing to do: the sandbox is processes only, and the supervisor killed them.
        return None
