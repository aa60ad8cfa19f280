"""Cases whose verdict depends on the run number (``cpmatrix run --runs-per-test``)."""

import torch
import torch.distributed as dist


def _note(cell):
    """What this run saw, in its own folder: the test checks every run got its own."""
    (cell.out_dir / "run.txt").write_text(f"{cell.run_number} {cell.seed}\n")
    cell.record("run_number", cell.run_number)
    cell.record("seed", cell.seed)
    # The global RNG is seeded with the run's seed too (as the generator is).
    cell.record("draw", float(torch.rand(1)))


def stable(cell):
    _note(cell)
    x = torch.ones(2, dtype=cell.dtype)
    dist.all_reduce(x, group=cell.mesh.get_group("cp1"))
    assert float(x[0]) == cell.mesh.size(1)


def one_in_three(cell):
    """A planted flake: deterministic in the run number, failing every third run."""
    _note(cell)
    if cell.run_number % 3 == 0:
        raise AssertionError(f"planted flake: run {cell.run_number} fails")


def broken(cell):
    _note(cell)
    raise AssertionError("broken on every run")
