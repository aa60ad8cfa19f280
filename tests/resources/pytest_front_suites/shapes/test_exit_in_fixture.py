"""``pytest.exit()`` in a pytest fixture of a spawning class (issue 29): natively the
fixture runs in the pytest process, so the session ends there, with the exit's return
code; the test that called it has no report and the tests after it do not run."""

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


@pytest.fixture(autouse=True)
def _exit_before_the_second(request):
    if request.node.name == "test_b_exits_in_a_fixture":
        pytest.exit("planted pytest.exit in a fixture", returncode=3)


class ExitInFixture(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_a_runs_first(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)

    @with_comms
    def test_b_exits_in_a_fixture(self):
        pass

    @with_comms
    def test_c_never_runs(self):
        pass
