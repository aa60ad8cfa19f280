"""``cpmatrix.worker.watchdog``: a command dies with the supervisor it watches (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cli_runner import pid_alive, wait_for
from cpmatrix.worker.watchdog import alive, boot_id, start_time, watch_argv


def test_a_process_is_known_by_its_pid_and_start_time() -> None:
    me = start_time(os.getpid())
    assert me is not None and alive(os.getpid(), me)
    assert not alive(os.getpid(), me + 1)  # a recycled pid started at another time
    assert start_time(2**22 + 1) is None and not alive(2**22 + 1, 0)


def test_the_exit_code_of_the_command_comes_back() -> None:
    argv = watch_argv(sys.executable, os.getpid(), [sys.executable, "-c", "raise SystemExit(7)"])
    assert subprocess.run(argv, check=False).returncode == 7


def test_a_supervisor_on_another_machine_is_not_watched() -> None:
    # a Slurm node: the submit host's pid means nothing here, so it must not end the command
    argv = watch_argv(sys.executable, os.getpid(), [sys.executable, "-c", "pass"])
    assert argv[5] == boot_id() and len(boot_id()) > 8
    argv[3], argv[5] = "999999", "another-machine"  # a pid that does not run here
    assert subprocess.run([*argv[:-1], "import time; time.sleep(1.2)"],
                          check=False).returncode == 0


def test_usage_errors_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "cpmatrix.worker.watchdog", "1"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_the_tree_dies_with_the_supervisor(tmp_path: Path) -> None:
    supervisor = subprocess.Popen(["sleep", "300"])
    pids = tmp_path / "pids"
    # the command and a grandchild it leaves behind in its own session (a daemon)
    script = (f"import os, subprocess, time\n"
              f"p = subprocess.Popen(['setsid', 'sleep', '300'])\n"
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\n"
              f"time.sleep(300)\n")
    watchdog = subprocess.Popen(watch_argv(sys.executable, supervisor.pid,
                                           [sys.executable, "-c", script]),
                                stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the command to start", lambda: pids.exists() and " " in pids.read_text())
        started = [int(p) for p in pids.read_text().split()]
        assert all(pid_alive(p) for p in started)
        time.sleep(0.6)
        assert watchdog.poll() is None  # the supervisor lives: nothing happens
        supervisor.kill()
        supervisor.wait()
        _, err = watchdog.communicate(timeout=10)
        assert watchdog.returncode == 137 and "supervisor" in err
        wait_for("the tree to die", lambda: not any(pid_alive(p) for p in started),
                 timeout=10)
    finally:
        for proc in (supervisor, watchdog):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if watchdog.stderr is not None:
            watchdog.stderr.close()
