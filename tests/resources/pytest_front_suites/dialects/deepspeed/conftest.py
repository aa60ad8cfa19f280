"""The launching hook of a DeepSpeed-style suite (as DeepSpeed's conftest does it)."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if getattr(item.cls, "is_dist_test", False):
        kwargs = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
        mark = item.get_closest_marker("world_size")  # a method's own size wins
        item.cls().launch(item.originalname, kwargs, mark.args[0] if mark else None)
        item.runtest = lambda: True  # ran in the launched processes
