"""A build cache in the user's cache folder (issue 29): torch's C++ extensions and
DeepSpeed's ops are built once into ``~/.cache/torch_extensions`` and loaded from there
by every later run; natively the spawned ranks have the user's ``HOME``. A rank that
does not find what was built builds it again (DeepSpeed's shared-memory op: minutes)."""

import os

from torch._appdirs import user_cache_dir
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class UserCache(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_finds_what_an_earlier_run_built(self):
        # Where torch.utils.cpp_extension keeps its builds, for another name.
        built = os.path.join(user_cache_dir(appname="cpmatrix_shape_extensions"), "built")
        self.assertTrue(os.path.exists(built), f"{built} is missing: it would be rebuilt")
