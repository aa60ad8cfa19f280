"""A stand-in for DeepSpeed's package, written for these tests (not DeepSpeed's code), with
only what the shape needs: like DeepSpeed, it keeps a group it made in a module global
(DeepSpeed's ``deepspeed.utils.groups``) and forgets it when the group is destroyed
through its own ``deepspeed.comm.destroy_process_group``."""

from deepspeed import comm


def init_distributed(dist_backend=None, rank=-1, world_size=-1, **_kwargs):
    comm.init_distributed(dist_backend, rank, world_size)
