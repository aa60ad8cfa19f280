"""Two consecutive tests make the same sub-group with ``use_local_synchronization=True``
(issue 29, cause 7): its name is a hash of its ranks, the same in both tests, and its
keys (the gloo peers' addresses) live in the default group's store. Natively each test's
ranks are new processes with a new store; the second test must not read the first's."""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class SubGroups(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    def _all_reduce_in_a_local_group(self):
        group = dist.new_group([0, 1], use_local_synchronization=True,
                               timeout=timedelta(seconds=20))
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        self.assertEqual(t.item(), 2.0)
        dist.destroy_process_group(group)

    @with_comms
    def test_first(self):
        self._all_reduce_in_a_local_group()

    @with_comms
    def test_second(self):
        self._all_reduce_in_a_local_group()

    @with_comms
    def test_third(self):
        self._all_reduce_in_a_local_group()
