"""The drafter's own OS thread, and the target's cores, when one CPU is split between the two models.

Torch's CPU kernels parallelise with OpenMP, and what a parallel region uses is the *calling* thread's: its OpenMP
thread count (an ICV, per thread) and the affinity its worker threads inherit when that thread first makes them. Seen
on this project's torch (2.13, OpenMP + MKL; `tests/test_placement.py` checks it, no timing involved):

- `torch.set_num_threads(k)` in a thread sets that thread's OpenMP and MKL counts; another thread's stay as they were.
  It also sets the process-wide default that a thread starting later picks up at its first parallel op — so each
  thread sets its own, after any other thread did.
- `os.sched_setaffinity` on a thread's native id pins that thread only. The OpenMP workers a thread already made keep
  the mask they were made with (the main thread's first wide op made them with every core); workers a pinned thread
  makes later inherit its mask.

So `DrafterThread` pins its thread and sets its count in the thread itself, before any drafter work, and its workers
are made pinned. `TargetCores` pins every other thread of the process (the main thread and the workers it already
made) to the target's cores and sets the calling thread's count to match, while the engine steps, and puts masks and
count back between steps (a caller that interleaves engines, as the benchmarks do, gets its own cores back).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class DrafterThread:
    """One OS thread that runs the drafter's work in order; with `cores`, pinned to them with that many intra-op
    threads (set in the thread, before anything else runs there)."""

    def __init__(self, cores: frozenset[int] | None):
        self.cores = cores
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="specroll-drafter", initializer=self._pin)
        self.native_id: int = self._pool.submit(threading.get_native_id).result()

    def _pin(self) -> None:
        if self.cores:
            os.sched_setaffinity(threading.get_native_id(), self.cores)
            torch.set_num_threads(len(self.cores))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` on the drafter's thread; the future's `result()` waits for it (and raises what it raised)."""
        return self._pool.submit(fn, *args)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the drafter's thread, waited for."""
        return self.submit(fn, *args).result()

    def close(self, wait: bool = True) -> None:
        """Stop the thread once its work is done (`wait`: and wait for that)."""
        self._pool.shutdown(wait=wait)


class TargetCores:
    """Keeps every thread of the process but the drafter's on `cores` while the engine steps (`pin` … `unpin`), the
    calling thread with that many intra-op threads. The drafter's threads are `drafter`'s thread and the workers it
    made (their mask is within the drafter's cores)."""

    def __init__(self, cores: frozenset[int], drafter: DrafterThread):
        self.cores, self.drafter = cores, drafter
        self._saved: dict[int, set[int]] | None = None  # thread id → its mask before `pin`
        self._threads = 0  # the calling thread's intra-op count before `pin`

    def pin(self) -> None:
        if self._saved is not None:
            return
        self._saved, self._threads = {}, torch.get_num_threads()
        for tid in _threads():
            try:
                mask = os.sched_getaffinity(tid)
                if tid == self.drafter.native_id or mask <= self.drafter.cores:
                    continue
                os.sched_setaffinity(tid, self.cores)
                self._saved[tid] = mask
            except (ProcessLookupError, FileNotFoundError):  # the thread ended meanwhile
                continue
        torch.set_num_threads(len(self.cores))

    def unpin(self) -> None:
        if self._saved is None:
            return
        for tid, mask in self._saved.items():
            try:
                os.sched_setaffinity(tid, mask)
            except (ProcessLookupError, FileNotFoundError):
                continue
        torch.set_num_threads(self._threads)
        self._saved = None


def _threads() -> list[int]:
    """The native ids of this process's threads."""
    return [int(tid) for tid in os.listdir("/proc/self/task")]
