"""The rank side of benchmarks/world_start.py: time each phase of a world start.

Started by torchrun or by cpmatrix's fork launcher (``-m _world_start_rank OUT_DIR``);
writes ``OUT_DIR/rank<R>.json`` with wall-clock stamps of each phase.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    t = {"entered": time.time()}
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    t["torch_imported"] = time.time()
    import cpmatrix.worker.isolation
    import cpmatrix.worker.world_main  # noqa: F401

    t["cpmatrix_imported"] = time.time()
    dist.init_process_group("gloo")
    t["process_group"] = time.time()
    n = dist.get_world_size()
    rows = int(n**0.5)
    mesh = init_device_mesh("cpu", (rows, n // rows), mesh_dim_names=("a", "b"))
    t["mesh"] = time.time()
    x = torch.arange(24, dtype=torch.float64).view(12, 2)
    d = distribute_tensor(x, mesh, [Shard(0), Replicate()])
    assert torch.equal(d.full_tensor(), x)
    t["first_dtensor_op"] = time.time()
    rank = dist.get_rank()
    dist.destroy_process_group()
    with open(os.path.join(argv[0], f"rank{rank}.json"), "w") as f:
        json.dump(t, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
