"""This suite's launching hook and base class are ``../deepspeed``'s (DeepSpeed's shape,
written for these tests); this folder adds a stand-in of DeepSpeed's package
(``deepspeed/``) that caches the groups it makes, as DeepSpeed's does."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "deepspeed"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if getattr(item.cls, "is_dist_test", False):
        kwargs = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
        item.cls().launch(item.originalname, kwargs)
        item.runtest = lambda: True  # ran in the launched processes
