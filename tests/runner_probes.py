"""Shared by the runner tests: a 2-rank gloo world script run through each runner."""

import textwrap

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
