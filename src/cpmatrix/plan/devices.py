"""How many CUDA devices this host shows, counted without importing torch.

The one place that counts them (``cpmatrix run``, ``repro`` and the nox sessions ask it).

Example::

    >>> visible_cuda_devices({"CUDA_VISIBLE_DEVICES": ""})
    0
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

__all__ = ["visible_cuda_devices"]


def visible_cuda_devices(env: Mapping[str, str] | None = None) -> int:
    """Devices ``nvidia-smi -L`` lists, capped by ``CUDA_VISIBLE_DEVICES`` (0 without
    nvidia-smi, or with ``CUDA_VISIBLE_DEVICES`` set empty)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible == "":
        return 0
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    if visible:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count
