"""Shared by the runner tests: scripts run through each runner (a probe, a 2-rank world),
and the launch they run in."""

import os
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

from cpmatrix.supervise.runners import Launch, hermetic_env

ROOT = Path(__file__).resolve().parents[1]

# Two ranks: init gloo, all_reduce rank+1, each rank writes what it got and where it ran.
WORLD = textwrap.dedent(
    """
    import json, os, socket, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)], dtype=torch.float64)
    dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"sum": t.item(), "world": dist.get_world_size(),
                   "interfaces": [n for _, n in socket.if_nameindex()]}, f)
    dist.destroy_process_group()
    """
)

#: Set in the caller's environment by the runner tests; a cell must never see it.
SECRET = "cpmatrix-test-secret-value"

# A cell's view of the world through a runner, written as JSON to argv[1]/probe.json.
PROBE = textwrap.dedent(
    """
    import json, os, socket, sys
    out, readonly, hidden = sys.argv[1:4]
    def can_write(folder):
        try:
            with open(os.path.join(folder, "probe.txt"), "w") as f:
                f.write("x")
            return "ok"
        except OSError as exc:
            return exc.strerror
    try:
        import cpmatrix
        package = cpmatrix.__file__
    except ImportError:
        package = None
    seen = {
        "interfaces": [name for _, name in socket.if_nameindex()],
        "write_out": can_write(out),
        "write_readonly": can_write(readonly),
        "hidden_visible": os.path.exists(hidden),
        "secret": os.environ.get("CPMATRIX_TEST_SECRET"),
        "env": dict(os.environ),
        "env_keys": sorted(os.environ),
        "tz": os.environ.get("TZ"),
        "home": os.environ.get("HOME"),
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "prefix": sys.prefix,
        "cpmatrix": package,
        "pid": os.getpid(),
    }
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump(seen, f)
    """
)


def make_launch(tmp_path: Path, argv: tuple[str, ...], *, name: str = "t",
                source: Mapping[str, str] | None = None) -> Launch:
    """A launch shaped like the supervisor's: ``tmp_path/out`` (writable, with private
    HOME and TMPDIR) and ``tmp_path/src`` (read-only, on PYTHONPATH), the sources and the
    host Python read-only; ``source`` adds to the caller's environment (with SECRET set,
    which the hermetic environment must drop)."""
    out, src = tmp_path / "out", tmp_path / "src"
    for folder in (out / "home", out / "tmp", src):
        folder.mkdir(parents=True, exist_ok=True)
    env = hermetic_env(dict(os.environ, CPMATRIX_TEST_SECRET=SECRET, **(source or {})),
                       home=str(out / "home"), tmp=str(out / "tmp"),
                       extra={"PYTHONPATH": str(src)})
    return Launch(argv=argv, env=env, cwd=str(ROOT), writable=(str(out),),
                  readonly=(str(ROOT), str(src), sys.prefix), name=name)
