"""The torch flags the inventory restores are enumerated from the installed torch
(``cpmatrix.worker.torch_flags``): this test scans torch on its own, so a setting a new
torch adds is restored or written down as excluded, with why (issue 30, row 5)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re

import pytest

from cpmatrix.worker import torch_flags
from cpmatrix.worker.inventory import Inventory, settings
from cpmatrix.worker.torch_flags import EXCLUDED, candidates

torch = pytest.importorskip("torch")


def test_doctests_run() -> None:
    assert doctest.testmod(torch_flags).failed == 0


def _setters() -> set[str]:
    """Every setter torch has, found here without the module's rules."""
    found = {f"torch._C.{n}" for n in dir(torch._C) if re.match(r"_(jit_(texpr_)?)?set_", n)}
    found |= {f"torch.{n}" for n in dir(torch) if n.startswith("set_")}
    for info in pkgutil.iter_modules(torch.backends.__path__):
        try:
            module = importlib.import_module(f"torch.backends.{info.name}")
        except Exception:
            continue
        found |= {f"torch.backends.{info.name}.{n}" for n in dir(module)
                  if n.startswith("set_") and callable(getattr(module, n))}
        found |= {f"torch.backends.{info.name}.{n}" for n, v in vars(type(module)).items()
                  if (isinstance(v, property) and v.fset is not None)
                  or type(v).__name__ == "ContextProp"}
    return found


def test_every_torch_setter_is_restored_or_excluded_with_a_reason() -> None:
    names = {s.name.removeprefix("torch flag ") for s in settings()
             if s.name.startswith("torch flag ")}
    by_setter = {}
    for name, _, kind, _, setter in candidates(torch):
        by_setter[name if kind != "pair" else f"{name.rsplit('.', 1)[0]}.{setter}"] = name
    loose = []
    for setter in sorted(_setters()):
        flag = by_setter.get(setter)
        if flag is None:
            loose.append(f"{setter}: not enumerated")
        elif flag not in names and flag not in EXCLUDED and "_nvfuser_" not in flag:
            loose.append(f"{setter} ({flag}): neither restored nor excluded")
    assert not loose, "\n".join(loose)
    assert all(why for why in EXCLUDED.values())
    stale = [k for k in EXCLUDED if k not in set(by_setter.values())]
    assert not stale, f"excluded but not in this torch: {stale}"


def test_every_restored_flag_takes_its_own_value_back() -> None:
    flags = [s for s in settings() if s.name.startswith("torch flag ") and s.write]
    assert len(flags) > 50
    for s in flags:
        value = s.read()
        s.write(value)
        assert s.read() == value, s.name


@pytest.mark.parametrize("change", ["mha_fastpath", "jit_profiling_executor",
                                    "jit_texpr_fuser", "cudnn_benchmark"])
def test_a_flag_a_cell_leaves_is_put_back(change: str) -> None:
    inv = Inventory(settings())
    C = torch._C
    before = (torch.backends.mha.get_fastpath_enabled(), C._jit_set_profiling_executor(True),
              C._jit_texpr_fuser_enabled(), torch.backends.cudnn.benchmark)
    C._jit_set_profiling_executor(before[1])
    if change == "mha_fastpath":
        torch.backends.mha.set_fastpath_enabled(not before[0])
    elif change == "jit_profiling_executor":
        C._jit_set_profiling_executor(not before[1])
    elif change == "jit_texpr_fuser":
        C._jit_set_texpr_fuser_enabled(not before[2])
    else:  # not by setattr: that raises once torch's test harness (common_utils, which
        # another test of this process may import) has frozen the backends' flags
        torch._C._set_cudnn_benchmark(not before[3])
    assert inv.after_cell() == []
    after = (torch.backends.mha.get_fastpath_enabled(), C._jit_set_profiling_executor(True),
             C._jit_texpr_fuser_enabled(), torch.backends.cudnn.benchmark)
    C._jit_set_profiling_executor(after[1])
    assert after == before
