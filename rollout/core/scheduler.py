"""Scheduler: which request runs in which batch slot (continuous batching).

Live rows always occupy slots `[0, num_live_rows)`, so every forward reads a prefix view of the KV
buffers. When rows finish, waiting requests take their slots; holes left when the queue is empty
are filled by moving the highest live rows down (a K/V row copy per move, once per finished row).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .request import Request


@dataclass
class Reschedule:
    """What the engine must do after a step: row moves (src → dst) and requests to prefill."""

    moves: list[tuple[int, int]]
    admitted: list[Request]


class Scheduler:
    """`admits(request)`: whether the caches can take the request now (and, if so, reserve its memory);
    a waiting request that does not fit waits, and so do the ones behind it (first come, first served)."""

    def __init__(self, num_slots: int, admits: Callable[[Request], bool] | None = None):
        self.num_slots = num_slots
        self.admits = admits or (lambda req: True)
        self.waiting: deque[Request] = deque()
        self.running: list[Request | None] = [None] * num_slots
        self.num_live_rows = 0

    def add(self, requests: list[Request]) -> None:
        self.waiting.extend(requests)

    @property
    def done(self) -> bool:
        return self.num_live_rows == 0 and not self.waiting

    def admit(self) -> list[Request]:
        """Fill free slots at the end of the live prefix from the queue."""
        admitted = []
        while self.waiting and self.num_live_rows < self.num_slots and self.admits(self.waiting[0]):
            req = self.waiting.popleft()
            self._place(req, self.num_live_rows)
            self.num_live_rows += 1
            admitted.append(req)
        return admitted

    def retire(self, finished_slots: list[int]) -> Reschedule:
        """Free the finished slots; refill them from the queue, then pack the live rows."""
        for slot in finished_slots:
            req = self.running[slot]
            req.slot = -1
            self.running[slot] = None
        holes = sorted(finished_slots)
        admitted = []
        while holes and self.waiting and self.admits(self.waiting[0]):
            req = self.waiting.popleft()
            self._place(req, holes.pop(0))
            admitted.append(req)
        moves = []
        new_live = self.num_live_rows - len(holes)
        sources = [s for s in range(new_live, self.num_live_rows) if self.running[s] is not None]
        for hole in (h for h in holes if h < new_live):
            src = sources.pop()
            self._place(self.running[src], hole)
            self.running[src] = None
            moves.append((src, hole))
        self.num_live_rows = new_live
        return Reschedule(moves=moves, admitted=admitted)

    def _place(self, req: Request, slot: int) -> None:
        req.slot = slot
        self.running[slot] = req
