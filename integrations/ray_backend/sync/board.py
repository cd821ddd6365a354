"""WeightBoard: the latest successfully synced weights per role, kept for workers that restart.

A Ray actor restarted after a crash re-runs `__init__` with its original arguments; a worker is
given this board's handle and, in `__init__`, loads whatever the board holds before it serves — so a
restarted worker never generates with stale weights. The board keeps object-store payloads (refs
owned by the controller) for the object-store transport, and for the broadcast the workers that staged
the version (`PeerRoute`: a restarted worker gets it from one of them). A version is posted once every live
worker has staged it, and posting is a sync's commit point: the workers commit it next, and one that
restarts from then on loads it here (see `protocol`).
"""

from __future__ import annotations

import ray

from .payload import PeerRoute, WeightPayload


@ray.remote(num_cpus=0)
class WeightBoard:
    def __init__(self) -> None:
        self._latest: dict[str, WeightPayload] = {}

    def post(self, role: str, payload: WeightPayload) -> None:
        if not isinstance(payload.route, (tuple, PeerRoute)):
            raise ValueError(f"payload.route={type(payload.route).__name__} is invalid: "
                             "object-store refs or a PeerRoute")
        self._latest[role] = payload

    def latest(self) -> dict[str, WeightPayload]:
        return dict(self._latest)

    def ping(self, payload: WeightPayload) -> None:
        """Receive (and drop) a payload: the controller sends one at startup, so the first sync does not
        wait for this process's one-time setup. It imports only Ray and `payload` (standard library),
        never torch: keep it that way, or every controller start pays seconds more CPU here."""
        return None
