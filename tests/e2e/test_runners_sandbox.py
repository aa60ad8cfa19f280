"""The bubblewrap runner: its command line (pure) and real sandboxes (bwrap, torchrun, gloo).

The real tests run commands through the runner exactly as the supervisor does: the argv
and env from ``command()``, in a new session. Nothing here sends traffic anywhere but
loopback; the network checks only list interfaces.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cpmatrix.kinds.world.job import free_port
from cpmatrix.supervise.runners import Launch, get_runner
from cpmatrix.supervise.runners.sandbox import (
    CELL_HOSTNAME,
    SandboxRunner,
    hosts_file,
    python_roots,
    sandbox_argv,
)
from runner_probes import PROBE, WORLD, make_launch

ROOT = Path(__file__).resolve().parents[2]


def run(runner: SandboxRunner, launch: Launch, timeout: float = 120) -> tuple[int, str]:
    argv, env = runner.command(launch)
    done = subprocess.run(
        argv,
        env=env,
        cwd=launch.cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


# ----------------------------------------------------------------------------- pure


def test_binds_are_ordered_parent_first_and_after_tmpfs() -> None:
    launch = Launch(
        argv=("x",),
        env={},
        cwd="/p",
        readonly=("/p", "/tmp/ro"),
        writable=("/p/out/w1",),
    )
    argv = sandbox_argv(launch, bwrap="bwrap")
    tmpfs = argv.index("--tmpfs")
    ro = [
        i for i, a in enumerate(argv) if a == "--ro-bind-try" and argv[i + 1] in ("/p", "/tmp/ro")
    ]
    rw = argv.index("--bind")
    assert all(i > tmpfs for i in [*ro, rw]), "binds under /tmp must come after --tmpfs /tmp"
    assert argv[rw + 1 : rw + 3] == ["/p/out/w1", "/p/out/w1"]
    assert ro[0] < rw, "the read-only parent must be bound before the writable child"


@pytest.mark.parametrize(
    ("readonly", "writable", "expect"),
    [
        (("/a",), ("/a",), "--bind"),  # writable wins for the same path
        (("/a",), (), "--ro-bind-try"),
        ((), ("/a",), "--bind"),
    ],
)
def test_mode_of_a_path(readonly: tuple[str, ...], writable: tuple[str, ...], expect: str) -> None:
    launch = Launch(argv=("x",), env={}, cwd="/", readonly=readonly, writable=writable)
    argv = sandbox_argv(launch)
    modes = [argv[i - 1] for i, a in enumerate(argv) if a == "/a" and argv[i + 1] == "/a"]
    assert modes == [expect]


def test_environment_is_cleared_then_set_and_argv_is_last() -> None:
    launch = Launch(argv=("-weird", "arg"), env={"B": "2", "A": "1"}, cwd="/w")
    argv = sandbox_argv(launch)
    assert "--clearenv" in argv
    assert argv.index("--clearenv") < argv.index("--setenv")
    assert flag_values(argv, "--setenv") == ["A", "B"]
    assert argv[-3:] == ["--", "-weird", "arg"]
    assert flag_values(argv, "--chdir") == ["/w"]
    assert "--unshare-net" in argv and "--die-with-parent" in argv
    # The supervisor signals ranks by the pid they report: no pid namespace.
    assert "--unshare-pid" not in argv


def test_gpu_nodes_only_for_cuda() -> None:
    launch = Launch(argv=("x",), env={}, cwd="/", devices=(1, 3))
    assert "--dev-bind-try" not in sandbox_argv(launch)
    nodes = flag_values(sandbox_argv(launch, gpus=True), "--dev-bind-try")
    assert nodes[:2] == ["/dev/nvidia1", "/dev/nvidia3"]
    assert "/dev/nvidiactl" in nodes


def test_hosts_file_names_every_loopback_form() -> None:
    text = Path(hosts_file()).read_text()
    assert hosts_file() == hosts_file()  # made once, reused
    for address in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        assert any(line.split()[0] == address for line in text.splitlines())
    assert CELL_HOSTNAME in text


def test_python_roots_follow_a_venv_to_its_base(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(
        "home = /opt/base-python/bin\ninclude-system-site-packages = false\n"
    )
    launch = Launch(
        argv=(str(venv / "bin" / "python"),), env={"LD_LIBRARY_PATH": "/opt/l:rel"}, cwd="/"
    )
    roots = python_roots(launch)
    assert {str(venv), "/opt/base-python", "/opt/l", sys.prefix} <= set(roots)
    assert "rel" not in roots
    # /bin/python3 is a link into /usr: its "prefix" is / and must never be bound.
    assert "/" not in python_roots(Launch(argv=("/bin/python3",), env={}, cwd="/"))


def test_get_runner_builds_it() -> None:
    runner = get_runner("sandbox")
    assert isinstance(runner, SandboxRunner)
    assert runner.identity() == {"runner": "sandbox"}
    with pytest.raises(ValueError, match="device"):
        SandboxRunner(device="tpu")


def test_missing_bwrap_is_a_reason() -> None:
    reason = SandboxRunner(bwrap="no-such-bwrap-here").unavailable()
    assert reason is not None and "apt-get install -y bubblewrap" in reason


# ----------------------------------------------------------------------------- real

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed (apt-get install bubblewrap)"
)


@pytest.fixture(scope="module")
def runner() -> SandboxRunner:
    sandbox = SandboxRunner()
    reason = sandbox.unavailable()
    if reason is not None and shutil.which("bwrap") is not None:
        pytest.fail(f"bwrap is installed but cannot sandbox: {reason}")
    return sandbox


@needs_bwrap
def test_a_cell_sees_loopback_its_folder_and_nothing_else(
    runner: SandboxRunner, tmp_path: Path
) -> None:
    hidden = tmp_path / "hidden"  # beside the cell's folders, not given to it
    hidden.mkdir()
    probe, out = tmp_path / "src" / "probe.py", tmp_path / "out"
    launch = make_launch(tmp_path, (sys.executable, str(probe), str(out), str(ROOT), str(hidden)))
    probe.write_text(PROBE)
    rc, output = run(runner, launch)
    assert rc == 0, output
    seen = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert seen["interfaces"] == ["lo"]
    assert seen["write_out"] == "ok"
    assert seen["write_readonly"] == "Read-only file system"
    assert not (ROOT / "probe.txt").exists()
    assert seen["hidden_visible"] is False
    assert seen["secret"] is None and "CPMATRIX_TEST_SECRET" not in seen["env_keys"]
    # Exactly the launch's env; bwrap adds only PWD for the --chdir folder.
    assert sorted({*launch.env, "PWD"}) == seen["env_keys"]
    assert (seen["tz"], seen["home"], seen["cwd"]) == ("UTC", launch.env["HOME"], str(ROOT))
    assert seen["hostname"] == CELL_HOSTNAME
    assert seen["pid"] > 2  # a host pid, usable by the supervisor


@needs_bwrap
@pytest.mark.slow
def test_two_rank_gloo_world(runner: SandboxRunner, tmp_path: Path) -> None:
    script = tmp_path / "src" / "world.py"
    argv = (
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0",
        str(script), str(tmp_path / "out"),
    )  # fmt: skip
    launch = make_launch(tmp_path, argv)
    script.write_text(WORLD)
    start = time.monotonic()
    rc, output = run(runner, launch)
    wall = time.monotonic() - start
    assert rc == 0, output
    for rank in (0, 1):
        got = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
        assert got == {"sum": 3.0, "world": 2, "interfaces": ["lo"]}
    # The sandbox's own /etc/hosts answers c10d's reverse look-ups (no per-rank warning).
    assert "hostname of the client socket cannot be retrieved" not in output
    print(f"2-rank gloo world in the sandbox: {wall:.1f}s")


def _pids_with(token: str) -> list[int]:
    """Processes whose command line holds ``token`` (only ours: the token is unique)."""
    needle = token.encode()
    return sorted(
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and needle in _cmdline(int(entry))
    )


CHILD_CODE = b"import time; time.sleep(300)"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _settle(check: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@needs_bwrap
def test_killing_the_group_leaves_no_process(runner: SandboxRunner, tmp_path: Path) -> None:
    token = f"cpmatrix-kill-test-{os.getpid()}-{time.monotonic_ns()}"
    ready = tmp_path / "out" / "ready"
    # A parent with a child in a new session (as torchrun starts ranks), both sleeping.
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {CHILD_CODE.decode()!r}, {token!r}],"
        " start_new_session=True)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(300)\n"
    )
    launch = make_launch(tmp_path, (sys.executable, "-c", code, token))
    argv, env = runner.command(launch)
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), "the sandboxed command never started"
        child = [p for p in _pids_with(token) if _cmdline(p).split(b"\0")[2] == CHILD_CODE]
        assert len(child) == 1
        # What the supervisor does on a hang: kill the group; that takes bwrap and the
        # sandboxed command (torchrun) ...
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _settle(lambda: _pids_with(token) == child), _pids_with(token)
        # ... and a process in a session of its own (a rank) by the pid it reported: the
        # sandbox shares the host's pid namespace, so that pid is the real one.
        os.kill(child[0], signal.SIGKILL)
        assert _settle(lambda: _pids_with(token) == [])
        runner.cleanup(launch)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
