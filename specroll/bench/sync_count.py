"""Host↔device syncs of a CUDA run, counted by torch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`:
one warning per synchronizing CUDA call), and where in specroll's code each one comes from. `bench.gpu_check`'s
sync cell uses it; on a CPU nothing syncs and nothing is counted."""

from __future__ import annotations

import collections
import os
import traceback
import warnings
from collections.abc import Callable

import torch

SYNC_WARNING = "called a synchronizing CUDA operation"  # what torch's sync debug mode warns at each sync
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # the repository


def count_syncs(run: Callable[[], object], device: str,
                sites: collections.Counter[str] | None = None) -> int | None:
    """Host↔device syncs while `run()` runs, as torch's sync debug mode reports them (None on a CPU); with
    `sites`, each sync is also counted there by the specroll source lines that made it (`sync_site`)."""
    if not device.startswith("cuda"):
        run()
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every sync, not the first per call site
        record = getattr(warnings, "_showwarnmsg_impl", None)  # catch_warnings(record=True)'s appender
        if sites is not None and record is not None:
            def record_with_site(message, record=record):
                record(message)
                if SYNC_WARNING in str(message.message):
                    sites[sync_site(traceback.extract_stack()[:-1])] += 1
            warnings._showwarnmsg_impl = record_with_site
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()  # the call's work done (with the mode off: this sync is not counted)
    return count_sync_warnings(caught)


def count_sync_warnings(caught: list[warnings.WarningMessage]) -> int:
    return sum(SYNC_WARNING in str(w.message) for w in caught)


def sync_site(stack: traceback.StackSummary, depth: int = 3) -> str:
    """The innermost `depth` frames of specroll's own code in `stack` (innermost first), and the torch or
    transformers call below them that synced: where to look."""
    def own(frame: traceback.FrameSummary) -> bool:  # a file of the repository's, not of a venv inside it
        path = os.path.realpath(frame.filename)
        return path.startswith(PACKAGE_ROOT + os.sep) and "site-packages" not in path

    ours = [f for f in stack if own(f)]
    below = next((f for f in reversed(stack) if not own(f) and "warnings" not in f.filename), None)
    named = [f"{os.path.relpath(os.path.realpath(f.filename), PACKAGE_ROOT)}:{f.lineno} {f.name}"
             for f in reversed(ours[-depth:])]
    inner = f"{os.path.basename(below.filename)}:{below.lineno} {below.name} < " if below is not None and ours and \
        stack.index(below) > stack.index(ours[-1]) else ""
    return inner + (" < ".join(named) or "outside specroll")
