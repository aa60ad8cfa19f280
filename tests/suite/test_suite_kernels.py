"""The Triton kernels of the reference suite against torch, and their spill-gate specs.

Each mode runs once in a fresh subprocess (see ``_kernel_checks.py`` for why): the
``interpret`` mode with ``TRITON_INTERPRET=1`` on CPU tensors, the ``compile`` mode
without it (AOT compile for sm_90, no GPU needed). Skipped when triton is missing;
marked slow (two subprocesses, several seconds each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).with_name("_kernel_checks.py")

INTERPRET = ["softmax_fp32_fwd_bwd", "softmax_lse_masked_rows", "softmax_bf16",
             "merge_matches_reference", "merge_equals_joint_softmax", "layer_norm_fp32_fwd_bwd",
             "layer_norm_bf16", "fp64_is_rejected"]
COMPILE = ["spill_specs_compile_for_sm90", "cpu_launch_without_interpreter_is_explained"]


@cache
def _run(mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if mode == "interpret":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, str(SCRIPT), mode], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode != 0:
        return {"__crash__": f"exit {proc.returncode}\n{proc.stderr[-4000:]}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "name"), [("interpret", n) for n in INTERPRET]
                         + [("compile", n) for n in COMPILE])
def test_kernel(mode: str, name: str) -> None:
    res = _run(mode)
    assert "__crash__" not in res, res.get("__crash__")
    assert name in res, f"{name} did not run; ran {sorted(res)}"
    print(f"[{mode}] {name}: {res[name]['detail']}")
    assert res[name]["ok"], res[name]["detail"]
