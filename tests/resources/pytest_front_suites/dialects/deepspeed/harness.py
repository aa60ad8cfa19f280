"""A DeepSpeed-style distributed test base, written for these tests (not DeepSpeed's code).

A test class sets ``world_size`` (an int or a list of ints); this folder's conftest
launches one process per rank for each size and runs the test method in each, with the
default process group made from a file store. That is how DeepSpeed's own
``tests/unit/common.py`` and ``conftest.py`` run their suite natively.
"""

import multiprocessing
import os
import tempfile
import traceback

import torch.distributed as dist

SKIP_CODE = 77


class DistributedTest:
    world_size = 2
    exec_timeout = 120
    is_dist_test = True
    # As DeepSpeed's DistributedExec: make the group (then a barrier) unless the class
    # says not; the launcher's variables (LOCAL_SIZE among them) unless the class says not.
    init_distributed = True
    set_dist_env = True

    def _rank_main(self, name, kwargs, rank, size, store_path, queue):
        try:
            if self.set_dist_env:
                os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                                  LOCAL_SIZE=str(size))
            if self.init_distributed:
                dist.init_process_group("gloo", init_method=f"file://{store_path}",
                                        rank=rank, world_size=size)
                dist.barrier()
            getattr(self, name)(**kwargs)
            if dist.is_initialized():
                dist.barrier()
            queue.put((rank, "ok", ""))
        except BaseException as exc:
            skip = type(exc).__name__ == "Skipped"
            queue.put((rank, "skip" if skip else "error",
                       str(exc) if skip else traceback.format_exc()))

    def launch(self, name, kwargs, size_override=None):
        sizes = self.world_size if size_override is None else size_override
        sizes = sizes if isinstance(sizes, list) else [sizes]
        ctx = multiprocessing.get_context("fork")
        for size in sizes:
            with tempfile.NamedTemporaryFile(delete=False) as f:
                store = f.name
            queue = ctx.Queue()
            procs = [ctx.Process(target=self._rank_main,
                                 args=(name, kwargs, r, size, store, queue))
                     for r in range(size)]
            for p in procs:
                p.start()
            results = [queue.get(timeout=self.exec_timeout) for _ in procs]
            for p in procs:
                p.join(timeout=self.exec_timeout)
            errors = [r for r in results if r[1] == "error"]
            if errors:
                raise AssertionError("\n".join(f"rank {r}: {tb}" for r, _, tb in errors))
            skips = [r for r in results if r[1] == "skip"]
            if skips:
                import pytest

                pytest.skip(skips[0][2])
