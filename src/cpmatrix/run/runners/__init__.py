"""Runners: how a world's torchrun command is executed (local, sandbox, docker).

Each runner turns a :class:`~cpmatrix.run.runners.base.Launch` into the argv to exec.
The supervisor owns the process; a runner only shapes the command and cleans up
what outlives a killed process group (a container).
"""

from cpmatrix.run.runners.base import Launch, Runner, get_runner, runner_names

__all__ = ["Launch", "Runner", "get_runner", "runner_names"]
