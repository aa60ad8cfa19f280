"""Installed modules a test file imports (issue 29, the ranks' second collection): the
fork launcher imports them once before the ranks fork, so each rank finds them loaded.
A pytest plugin's package is never imported early (pytest rewrites its asserts), nor a
module of the project. The test that runs this suite installs the two packages (a
``RECORD`` each, one registering a ``pytest11`` plugin) and names a folder in
``CPMATRIX_SHAPE_FACTS``; each rank writes there where each module was imported."""

import json
import os

import cpmx_shape_installed
import cpmx_shape_plugin.extra
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class Preloaded(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_where_the_modules_were_imported(self):
        facts = os.environ.get("CPMATRIX_SHAPE_FACTS")
        if facts:
            with open(os.path.join(facts, f"{os.getpid()}.json"), "w") as f:
                json.dump({"pid": os.getpid(), "installed": cpmx_shape_installed.LOADED_IN,
                           "plugin": cpmx_shape_plugin.extra.LOADED_IN}, f)
