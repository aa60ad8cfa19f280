"""pytest's temporary folders around multi-rank tests (issue 29, cause 3): an autouse
fixture asks for ``tmp_path``, ``tmpdir`` and ``tmp_path_factory`` (as DeepSpeed's suite
does for every test) and a marker test takes ``tmp_path`` itself."""

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


@pytest.fixture(autouse=True)
def scratch(tmp_path, tmpdir, tmp_path_factory):
    (tmp_path / "a.txt").write_text("a")
    tmpdir.join("b.txt").write("b")
    made = tmp_path_factory.mktemp("shared")
    assert made.is_dir() and (tmp_path / "a.txt").read_text() == "a"


class WithScratch(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_all_reduce(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)
