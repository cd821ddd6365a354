"""`EngineConfig.drafter_device`: the device the drafter's weights, cache and draft step live on.

    parse_drafter_device("cuda:0")        # another accelerator, or "cpu" (the host) beside a "cuda" target
    parse_drafter_device("cpu:1")         # on a CPU-only machine: the last 1 core of this process's cores
    parse_drafter_device("cpu:cores=2-3") # ... or exactly these cores ("0,2", "1-3,6")

A CPU placement with cores splits one CPU between the two models: the drafter runs in its own OS thread pinned to its
cores with as many intra-op threads (`threads.DrafterThread`), the target on the rest (`threads.pin_target`). Torch
reads "cpu:1" as CPU device 1, which means nothing on one host; here the number after "cpu:" counts cores. The syntax
is checked when the config is made; whether the cores exist and leave the target some is checked when the engine is
built (`DrafterPlacement.split`), on the machine that runs it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

ALLOWED = ("None (the target's device, in series), a torch device string ('cuda:0', 'cpu'), or on a CPU the drafter's "
           "cores: 'cpu:N' (the last N of this process's cores) or 'cpu:cores=LIST' (core ids, e.g. '1' or '2-3,6')")
_COUNT = re.compile(r"cpu:(\d+)")
_CORES = re.compile(r"cpu:cores=(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)")


@dataclass(frozen=True)
class DrafterPlacement:
    """Where the drafter runs: `device`, and on a CPU the cores it takes (`count` of them, or exactly `cores`; both
    None: no core split — the drafter shares the device's cores, or has a device of its own)."""

    device: torch.device
    count: int | None = None
    cores: frozenset[int] | None = None

    @property
    def splits_cores(self) -> bool:
        return self.count is not None or self.cores is not None

    def split(self, available: set[int] | None = None) -> tuple[frozenset[int], frozenset[int]]:
        """(drafter cores, target cores) out of `available` (None: this process's, `os.sched_getaffinity`).
        `ValueError` where the drafter's cores are not available or leave the target none."""
        have = sorted(os.sched_getaffinity(0) if available is None else available)
        if self.cores is not None:
            drafter = self.cores
            missing = sorted(drafter - set(have))
            if missing:
                raise ValueError(f"drafter_device cores {sorted(drafter)} are invalid: {missing} are not among this "
                                 f"process's cores {have}")
        else:
            drafter = frozenset(have[max(len(have) - self.count, 0):])
        target = frozenset(have) - drafter
        if not target:
            raise ValueError(f"drafter_device takes {len(drafter)} of this process's {len(have)} cores {have}: leave "
                             "the target at least one")
        return drafter, target


def parse_drafter_device(value: str) -> DrafterPlacement:
    """A `drafter_device` string as a placement; `ValueError` naming the field, the value and what is allowed."""
    if not isinstance(value, str):
        raise ValueError(f"drafter_device={value!r} is invalid: {ALLOWED}")
    count, cores = _COUNT.fullmatch(value), _CORES.fullmatch(value)
    if count:
        if int(count.group(1)) < 1:
            raise ValueError(f"drafter_device={value!r} is invalid: at least 1 core ({ALLOWED})")
        return DrafterPlacement(torch.device("cpu"), count=int(count.group(1)))
    if cores:
        ids: set[int] = set()
        for part in cores.group(1).split(","):
            lo, _, hi = part.partition("-")
            if hi and int(hi) < int(lo):
                raise ValueError(f"drafter_device={value!r} is invalid: range {part!r} runs backwards ({ALLOWED})")
            ids.update(range(int(lo), int(hi or lo) + 1))
        return DrafterPlacement(torch.device("cpu"), cores=frozenset(ids))
    if value.startswith("cpu:"):
        raise ValueError(f"drafter_device={value!r} is invalid: {ALLOWED}")
    try:
        return DrafterPlacement(torch.device(value))
    except RuntimeError as err:
        raise ValueError(f"drafter_device={value!r} is invalid: {ALLOWED} ({err})") from err
