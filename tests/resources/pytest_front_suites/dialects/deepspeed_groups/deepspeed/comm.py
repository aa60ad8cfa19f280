"""The stand-in's communication module (DeepSpeed's ``deepspeed.comm`` in shape)."""

import torch.distributed as dist

_initialized = False
_world_clone = None


def init_distributed(backend, rank, world_size):
    global _initialized
    if not dist.is_initialized():
        dist.init_process_group(backend or "gloo", rank=rank, world_size=world_size)
    _initialized = True


def is_initialized():
    return _initialized and dist.is_initialized()


def world_clone():
    """A group of every rank, made once and kept (DeepSpeed's ``_clone_world_group``)."""
    global _world_clone
    if _world_clone is None:
        _world_clone = dist.new_group(ranks=list(range(dist.get_world_size())))
    return _world_clone


def destroy_process_group(group=None):
    """Destroys the group and forgets it where it was kept."""
    global _world_clone
    dist.destroy_process_group(group)
    if group is None or group is _world_clone:
        _world_clone = None
