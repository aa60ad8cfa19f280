"""Cases that try to make cpmatrix report PASS for failing code (tests/worlds/test_trust.py).

Each one is an adversarial neighbour: it changes process state, breaks the world, or
writes text XML cannot hold. The cell after it must still get its true verdict.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

#: Module state: a cell that bumps it must not be seen by the next cell (fresh import).
COUNTER = [0]


def patch_assert_close(cell):
    """Replace torch.testing.assert_close with a no-op and pass."""
    torch.testing.assert_close = lambda *args, **kwargs: None


def genuine_failure(cell):
    """A real mismatch: passes only if assert_close was left patched."""
    torch.testing.assert_close(torch.zeros(3, dtype=cell.dtype), torch.ones(3, dtype=cell.dtype))


def mutate_state(cell):
    """Change every piece of process state cpmatrix promises to restore; pass."""
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("medium")
    torch.autograd.set_detect_anomaly(True)
    os.chdir("/")
    sys.path.insert(0, "/nonexistent-cpmatrix-path")
    os.environ["CPMATRIX_TRUST_LEAK"] = "1"
    COUNTER[0] += 1
    import random

    random.seed(12345)


def state_fingerprint(cell):
    """Record the process state a cell starts in; fail if any of it leaked in."""
    import random

    state = {
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "anomaly": torch.is_anomaly_enabled(),
        "cwd_is_root": os.getcwd() == "/",
        "bad_sys_path": "/nonexistent-cpmatrix-path" in sys.path,
        "leaked_env": "CPMATRIX_TRUST_LEAK" in os.environ,
        "counter": COUNTER[0],
        "py_random": random.random(),
        "torch_random": float(torch.rand(1)),
    }
    for key, value in state.items():
        cell.record(key, value)
    expect = {"default_dtype": "torch.float32", "grad_enabled": True, "deterministic": False,
              "matmul_precision": "highest", "anomaly": False, "cwd_is_root": False,
              "bad_sys_path": False, "leaked_env": False, "counter": 0}
    leaked = {k: state[k] for k, v in expect.items() if state[k] != v}
    assert not leaked, f"state leaked from an earlier cell: {leaked}"


def destroy_world(cell):
    """Tear down the world's process group and pass."""
    dist.destroy_process_group()


def innocent(cell):
    """A real collective over the cell's mesh."""
    x = torch.ones(4, dtype=cell.dtype)
    dist.all_reduce(x, group=cell.mesh.get_group("cp1"))
    assert float(x[0]) == cell.mesh.size(1)
    cell.record("sum", float(x[0]))


def own_timeout_message(cell):
    """Rank 1's own error says "Timed out waiting"; rank 0 waits in a collective."""
    if cell.rank == 1:
        raise RuntimeError("Timed out waiting for the answer from the oracle")
    dist.all_reduce(torch.ones(2), group=cell.mesh.get_group("cp1"))


def control_chars(cell):
    """Print, record and raise text XML 1.0 cannot hold."""
    print("\x1b[31mred log line\x1b[0m with a NUL \x00 and a bell \x07", flush=True)
    cell.record("note", "esc \x1b[1mbold\x1b[0m nul \x00 end")
    raise AssertionError("bad \x1b[31mvalue\x1b[0m \x00\x0b here")


def infinite_evidence(cell):
    """Evidence that JSON cannot spell without extensions."""
    cell.record("max_abs_diff", float("inf"))
    cell.record("min_value", float("-inf"))


def sleeper(cell):
    """Sleep ``secs`` (interrupt tests stop the run while this one runs)."""
    time.sleep(float(cell.params.get("secs", 60)))


#: Marks every process a ``spawner`` cell starts, so a test can find survivors.
MARK = "cpmatrix-trust-orphan"


def spawner(cell):
    """Start children every way a case can, write their pids, then spin until killed.

    A plain child (Popen), a forked child, and a double-forked daemon in its own session
    with an empty environment (so it carries no trace of the world it came from).
    """
    import json
    import subprocess

    pids = []
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {MARK}"])
    pids.append(child.pid)
    pid = os.fork()
    if pid == 0:  # a forked copy of the rank that spins
        while True:
            time.sleep(0.05)
    pids.append(pid)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        grandchild = subprocess.Popen(
            ["/bin/sh", "-c", f"exec sleep 600 # {MARK}"], env={}, start_new_session=True,
        )
        os.write(write, str(grandchild.pid).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    pids.append(int(os.read(read, 32)))
    (cell.out_dir / "pids.json").write_text(json.dumps({"rank": os.getpid(), "children": pids}))
    while True:
        time.sleep(0.05)
