"""Torch threads per process, set from the run's config whatever the inherited environment says.

    setting = set_torch_threads(1, "learner")       # first thing in a process (or actor) that runs torch
    setting.line()                                   # "learner: 1 intra-op / 1 inter-op thread (OMP_NUM_THREADS=2)"

Every process of a run that runs torch — the driver (TRL's trainer), each rollout worker, the learner
actor — calls it once, with its share of the machine: the driver `torch_threads`, an actor its
`num_cpus` (`actor_threads`). Without it a process takes its thread count from an inherited
`OMP_NUM_THREADS` (HPC modules, container images and job launchers export one; Ray passes the driver's
on to its workers and sets its own only where none is set): three processes of two spinning threads
each on two cores made the demo's learner ~20x slower, so slow that its time-bounded rounds finished
no optimizer step, and nothing said so (the learner's alarms, `online_drafter.gate.alarms`, now do).

The inter-op pool can be sized only before its first use in the process: set later, it keeps its size,
and the setting reports the size it has.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ThreadSetting:
    """What one process runs torch with, read back from torch after setting it."""

    process: str
    intra_op: int
    inter_op: int
    omp_num_threads: str | None  # the inherited environment variable, for the record

    def line(self) -> str:
        inherited = f"OMP_NUM_THREADS={self.omp_num_threads}" if self.omp_num_threads else "OMP_NUM_THREADS unset"
        return f"{self.process}: {self.intra_op} intra-op / {self.inter_op} inter-op threads ({inherited})"

    def as_dict(self) -> dict[str, int | str | None]:
        return asdict(self)


def actor_threads(num_cpus: float) -> int:
    """The torch threads of an actor given `num_cpus` by Ray: its whole CPUs, at least one."""
    if not num_cpus >= 0:
        raise ValueError(f"num_cpus={num_cpus!r} is invalid: a number >= 0")
    return max(1, math.floor(num_cpus))


def set_torch_threads(threads: int, process: str) -> ThreadSetting:
    """Run this process's torch on `threads` intra-op and inter-op threads; returns what torch then reports."""
    import torch

    if not (isinstance(threads, int) and threads >= 1):
        raise ValueError(f"threads={threads!r} is invalid: an int >= 1")
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != threads:
        # the pool already ran work in this process: it keeps its size (reported below)
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(threads)
    return current_threads(process)


def current_threads(process: str) -> ThreadSetting:
    """This process's torch threads as torch reports them (from the thread that asks)."""
    import torch

    return ThreadSetting(process, torch.get_num_threads(), torch.get_num_interop_threads(),
                         os.environ.get("OMP_NUM_THREADS"))
